"""The simulated world: B prompts, each a choice among M answers of which the first C are correct.

The policy is a softmax over answers with logits linear in shared parameters theta in R^d:

    z_{i,m}(theta) = theta . phi_{i,m} + b_{i,m} + h * ell * 1[m correct],
    pi(m | x_i)    = softmax_m z_{i,m},         p_i(theta) = sum_{m < C} pi(m | x_i).

Features phi_{i,m} put the correct answers of prompt i on the direction of its *skill* (one of S
skills) plus Gaussian noise, so that improving a skill lifts every prompt that uses it. Offsets
b_{i,m} are chosen so that p_i(0) equals a pass rate drawn from a Beta distribution: the world starts
with the spread of difficulties that chapter 1 is about. ``ell`` is a hint level (chapter 7): a hint
adds h * ell to the correct logits.

Exact quantities (chapter 2 and 3 use them to check derivations):

    grad log pi(m | x_i) = phi_{i,m} - phi_bar_i,        phi_bar_i = sum_m pi_m phi_{i,m},
    grad p_i            = sum_{m < C} pi_m (phi_{i,m} - phi_bar_i).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlcurate._validate import as_finite, as_int, as_int_array, as_probability


@dataclass
class Groups:
    """Sampled rollouts of several prompts, stored flat.

    ``prompt[j]``, ``action[j]``, ``reward[j]`` describe rollout j; ``group[j]`` is the index of its
    group in the order the prompts were requested; ``sizes[g]`` is the number of rollouts of group g.
    """

    prompt: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    group: np.ndarray
    sizes: np.ndarray
    hint_level: np.ndarray

    def rewards_of(self, g: int) -> np.ndarray:
        return self.reward[self.group == g]

    def split_rewards(self) -> list[np.ndarray]:
        """Rewards per group, in group order (empty arrays for groups of size 0)."""
        bounds = np.r_[0, np.cumsum(self.sizes)]
        return [self.reward[bounds[g]:bounds[g + 1]] for g in range(self.sizes.size)]

    @property
    def n_rollouts(self) -> int:
        return int(self.sizes.sum())


class SoftmaxWorld:
    """A population of simulated prompts (see the module docstring for the model).

    Build one with :meth:`make`. All methods take the parameter vector ``theta`` explicitly, so the
    world itself is immutable and many policies can be compared on it.
    """

    def __init__(self, features: np.ndarray, offsets: np.ndarray, n_correct: int, skill: np.ndarray,
                 hint_strength: float = 1.0):
        self.features = np.asarray(features, dtype=float)  # (B, M, d)
        self.offsets = np.asarray(offsets, dtype=float)  # (B, M)
        B, M, d = self.features.shape
        if self.offsets.shape != (B, M):
            raise ValueError(f"offsets must have shape {(B, M)}, got {self.offsets.shape}")
        self.n_correct = as_int(n_correct, "n_correct", minimum=1, maximum=M - 1)
        self.skill = np.asarray(skill)
        self.hint_strength = float(hint_strength)
        self.correct = np.zeros(M, dtype=bool)
        self.correct[: self.n_correct] = True

    # ------------------------------------------------------------------ construction
    @classmethod
    def make(cls, n_prompts: int = 256, n_actions: int = 8, n_correct: int = 1, n_skills: int = 4,
             noise_dims: int = 4, skill_scale: float = 1.0, noise_scale: float = 0.5,
             pass_rate_beta: tuple[float, float] = (0.5, 0.5), pass_rates=None,
             hint_strength: float = 1.0, out_of_reach: float = 0.0, seed: int = 0) -> "SoftmaxWorld":
        """A world whose initial pass rates p_i(0) follow Beta(``pass_rate_beta``) (or equal the given
        ``pass_rates``), clipped to [1e-4, 1 - 1e-4]. Beta(0.5, 0.5) piles prompts near 0 and 1,
        the regime where most groups are uniform (chapter 1).

        ``out_of_reach``: the share of the prompts, those of lowest p_i(0), that no theta changes (their
        features are zero, so p_i stays p_i(0)): a floor of prompts the policy never learns, as a language
        model may never solve some (chapter 11). 0 leaves every prompt within reach and draws the same world."""
        B = as_int(n_prompts, "n_prompts", minimum=1)
        if isinstance(out_of_reach, bool) or not isinstance(out_of_reach, (int, float)) or not 0 <= out_of_reach < 1:
            raise ValueError(f"out_of_reach must be a share in [0, 1), got {out_of_reach!r}")
        M = as_int(n_actions, "n_actions", minimum=2)
        C = as_int(n_correct, "n_correct", minimum=1, maximum=M - 1)
        S = as_int(n_skills, "n_skills", minimum=1)
        E = as_int(noise_dims, "noise_dims", minimum=0)
        rng = np.random.default_rng(seed)
        if pass_rates is None:
            a, b = (float(x) for x in as_finite(pass_rate_beta, "pass_rate_beta", positive=True))
            p0 = rng.beta(a, b, size=B)
        else:
            p0 = np.asarray(as_probability(pass_rates, "pass_rates"), dtype=float)
            if p0.shape != (B,):
                raise ValueError(f"pass_rates must have one entry per prompt ({B}), got shape {p0.shape}")
        p0 = np.clip(p0, 1e-4, 1 - 1e-4)
        skill = rng.integers(0, S, size=B)
        d = S + E
        feats = np.zeros((B, M, d))
        feats[:, :C, :][np.arange(B), :, skill] = skill_scale  # correct answers share the skill direction
        feats[:, :, S:] = noise_scale * rng.standard_normal((B, M, E))
        feats[:, :, :S] += 0.1 * noise_scale * rng.standard_normal((B, M, S))
        # Offsets: wrong answers 0; correct answers b so that p_i(0) = p0 given the features at theta=0
        # (features do not enter at theta = 0, so the offset alone sets the pass rate).
        offsets = np.zeros((B, M))
        offsets[:, :C] = np.log(p0 * (M - C) / (C * (1 - p0)))[:, None]
        feats[np.argsort(p0, kind="stable")[: round(out_of_reach * B)]] = 0.0  # after every draw: the same world at 0
        return cls(feats, offsets, C, skill, hint_strength)

    @property
    def n_prompts(self) -> int:
        return self.features.shape[0]

    @property
    def dim(self) -> int:
        return self.features.shape[2]

    def init_theta(self) -> np.ndarray:
        """The initial parameters (zeros), at which pass rates equal the drawn p_i(0)."""
        return np.zeros(self.dim)

    def _theta(self, theta) -> np.ndarray:
        t = as_finite(theta, "theta")
        if t.shape != (self.dim,):
            raise ValueError(f"theta must have shape ({self.dim},), got {t.shape}")
        return t

    def _idx(self, idx) -> np.ndarray:
        if idx is None:
            return np.arange(self.n_prompts)
        arr = as_int_array(np.atleast_1d(idx), "idx", minimum=0)
        if (arr >= self.n_prompts).any():
            raise ValueError(f"idx must be < n_prompts ({self.n_prompts}), got {int(arr.max())}")
        return arr

    # ------------------------------------------------------------------ exact quantities
    def logits(self, theta, idx=None, hint_level=0.0) -> np.ndarray:
        """z_{i,m} for the prompts ``idx`` (all by default) at hint level ``hint_level``."""
        t, i = self._theta(theta), self._idx(idx)
        z = self.features[i] @ t + self.offsets[i]
        level = np.broadcast_to(np.asarray(hint_level, dtype=float), i.shape)
        return z + (self.hint_strength * level)[:, None] * self.correct[None, :]

    def probs(self, theta, idx=None, hint_level=0.0) -> np.ndarray:
        """pi(m | x_i), shape (len(idx), M)."""
        z = self.logits(theta, idx, hint_level)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def pass_rates(self, theta, idx=None, hint_level=0.0) -> np.ndarray:
        """p_i(theta) = sum over correct answers of pi(m | x_i)."""
        return self.probs(theta, idx, hint_level)[:, self.correct].sum(axis=1)

    def grad_pass_rates(self, theta, idx=None, hint_level=0.0) -> np.ndarray:
        """grad_theta p_i, shape (len(idx), d), exact."""
        i = self._idx(idx)
        pi = self.probs(theta, i, hint_level)
        phi = self.features[i]
        phibar = np.einsum("bm,bmd->bd", pi, phi)
        pc = pi * self.correct
        return np.einsum("bm,bmd->bd", pc, phi) - pc.sum(axis=1, keepdims=True) * phibar

    def score(self, theta, prompt, action, hint_level=0.0) -> np.ndarray:
        """grad log pi(a | x) = phi_{x,a} - phi_bar_x for each (prompt, action) pair, shape (len, d)."""
        prompt = self._idx(prompt)
        action = as_int_array(np.atleast_1d(action), "action", minimum=0)
        level = np.broadcast_to(np.asarray(hint_level, dtype=float), prompt.shape)
        # phi_bar depends only on (prompt, hint level): compute it once per distinct pair.
        keys, inverse = np.unique(np.stack([prompt, level]), axis=1, return_inverse=True)
        uniq_prompt = keys[0].astype(np.int64)
        pi = self.probs(theta, uniq_prompt, keys[1])
        phibar = np.einsum("bm,bmd->bd", pi, self.features[uniq_prompt])
        return self.features[prompt, action] - phibar[inverse.reshape(-1)]

    def objective(self, theta, objective="linear", idx=None) -> float:
        """J_f(theta) = mean_i f(p_i(theta)) (chapter 2)."""
        from rlcurate.stats.objectives import get_objective

        return float(np.mean(get_objective(objective).f(self.pass_rates(theta, idx))))

    def grad_objective(self, theta, objective="linear", idx=None) -> np.ndarray:
        """grad J_f = mean_i f'(p_i) grad p_i, exact (chapter 2)."""
        from rlcurate.stats.objectives import get_objective

        i = self._idx(idx)
        w = get_objective(objective).weight(self.pass_rates(theta, i))
        return (w[:, None] * self.grad_pass_rates(theta, i)).mean(axis=0)

    def score_sq_norm(self, theta, idx=None, hint_level=0.0) -> np.ndarray:
        """S_i = E_a ||grad log pi(a | x_i)||^2, the mean squared norm of the score, exact (chapters 1, 3).

        It is the factor that the textbook variance sigma^2 ~ p (1 - p) S assumes equal across prompts."""
        i = self._idx(idx)
        pi = self.probs(theta, i, hint_level)
        phi = self.features[i]
        phibar = np.einsum("bm,bmd->bd", pi, phi)
        return np.einsum("bm,bmd->b", pi, (phi - phibar[:, None, :]) ** 2)

    def baselined_score_variance(self, theta, idx=None, baseline=None) -> np.ndarray:
        """sigma_g^2(x_i) = E||(r - b) grad log pi||^2 - ||grad p_i||^2, the trace of the covariance of
        one baselined rollout's gradient, exact (chapter 3). ``baseline`` defaults to p_i."""
        i = self._idx(idx)
        pi = self.probs(theta, i)
        phi = self.features[i]
        phibar = np.einsum("bm,bmd->bd", pi, phi)
        sc = phi - phibar[:, None, :]  # (b, M, d)
        p = (pi * self.correct).sum(axis=1)
        b = p if baseline is None else np.broadcast_to(np.asarray(baseline, float), p.shape)
        r_minus_b = self.correct[None, :] - b[:, None]  # (b, M)
        second = np.einsum("bm,bm,bmd->b", pi, r_minus_b**2, sc**2)
        mean = np.einsum("bm,bm,bmd->bd", pi, r_minus_b, sc)
        return second - (mean**2).sum(axis=1)

    # ------------------------------------------------------------------ sampling
    def sample(self, theta, idx, n, rng: np.random.Generator, hint_level=0.0) -> Groups:
        """Draw n_g rollouts for each requested prompt (``n`` a number or one per prompt; 0 allowed).

        Rollout rewards are 1 for a correct answer and 0 otherwise.
        """
        i = self._idx(idx)
        sizes = np.broadcast_to(as_int_array(n, "n", minimum=0), i.shape).astype(np.int64)
        level = np.broadcast_to(np.asarray(hint_level, dtype=float), i.shape)
        pi = self.probs(theta, i, level)
        group = np.repeat(np.arange(i.size), sizes)
        cdf = np.cumsum(pi, axis=1)[group]
        u = rng.random(group.size)[:, None]
        action = np.minimum((u > cdf).sum(axis=1), pi.shape[1] - 1)
        reward = self.correct[action].astype(float)
        return Groups(prompt=i[group], action=action, reward=reward, group=group, sizes=sizes,
                      hint_level=level[group])
