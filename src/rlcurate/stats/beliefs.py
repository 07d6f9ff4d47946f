"""Bayesian beliefs about pass rates and the information a rollout buys (chapter 9, *Selecting data by
information*; used by the INSIGHT and MoPPS curators).

Each prompt tau carries a Beta(alpha, beta) belief about its pass rate phi. After K rollouts with S
successes the belief moves to Beta(alpha + S, beta + K - S); with a discount lambda in (0, 1] old
evidence fades toward the prior (MoPPS; INSIGHT eq. 6):

    alpha <- lambda alpha + (1 - lambda) alpha_0 + S,   beta <- lambda beta + (1 - lambda) beta_0 + K - S.

The mutual information between K future rewards and phi has a closed form through the
beta-binomial distribution of S (INSIGHT eq. 12-13):

    I(R_1..K; phi) = H(Beta(alpha, beta)) - sum_s P(S = s) H(Beta(alpha + s, beta + K - s)),

and INSIGHT scores a prompt by w(mean) * I with the difficulty weight
w(m) = m (1 - m) exp(-eta (m - mu)^2).
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln, digamma, gammaln

from rlcurate._validate import as_finite, as_int, as_int_array, as_probability

__all__ = [
    "BetaBeliefs",
    "beta_entropy",
    "mutual_information",
    "expected_variance_reduction",
    "insight_weight",
    "insight_score",
    "mopps_select",
    "top_m",
]


def beta_entropy(a, b):
    """Differential entropy of Beta(a, b): ln B(a,b) - (a-1) psi(a) - (b-1) psi(b) + (a+b-2) psi(a+b)."""
    a = as_finite(a, "alpha", positive=True)
    b = as_finite(b, "beta", positive=True)
    h = betaln(a, b) - (a - 1) * digamma(a) - (b - 1) * digamma(b) + (a + b - 2) * digamma(a + b)
    return float(h) if h.ndim == 0 else h


def mutual_information(alpha, beta, K: int):
    """I(R_1..K; phi) in nats for a Beta(alpha, beta) belief and K Bernoulli(phi) rollouts (chapter 9).

    Closed form: H(Beta(alpha, beta)) - E_S[H(Beta(alpha + S, beta + K - S))], with S beta-binomial.
    Vectorised over ``alpha`` and ``beta``; always finite and >= 0.
    """
    a = np.atleast_1d(as_finite(alpha, "alpha", positive=True))
    b = np.atleast_1d(as_finite(beta, "beta", positive=True))
    a, b = np.broadcast_arrays(a, b)
    K = as_int(K, "K", minimum=0)
    s = np.arange(K + 1)
    log_comb = gammaln(K + 1) - gammaln(s + 1) - gammaln(K - s + 1)
    A = a[..., None] + s
    Bb = b[..., None] + K - s
    log_p = log_comb + betaln(A, Bb) - betaln(a, b)[..., None]
    post_h = betaln(A, Bb) - (A - 1) * digamma(A) - (Bb - 1) * digamma(Bb) + (A + Bb - 2) * digamma(A + Bb)
    mi = beta_entropy(a, b) - np.sum(np.exp(log_p) * post_h, axis=-1)
    mi = np.maximum(mi, 0.0)  # rounding can leave -1e-16
    scalar = np.ndim(alpha) == 0 and np.ndim(beta) == 0
    return float(mi.reshape(-1)[0]) if scalar else mi


def expected_variance_reduction(alpha, beta):
    """Expected drop of Var[phi] after one rollout: alpha beta / (n^2 (n + 1)^2) with n = alpha + beta,
    equal to mean (1 - mean) / (n + 1)^2 (INSIGHT eq. 8, chapter 9)."""
    a = as_finite(alpha, "alpha", positive=True)
    b = as_finite(beta, "beta", positive=True)
    n = a + b
    out = a * b / (n**2 * (n + 1) ** 2)
    return float(out) if np.ndim(out) == 0 else out


def insight_weight(mean, eta: float = 3.0, mu: float = 0.3):
    """INSIGHT's difficulty weight w(m) = m (1 - m) exp(-eta (m - mu)^2) (eq. 15, chapter 9).

    The paper's appendix prints mu = 3.0, which would make the Gaussian factor nearly constant
    decay; its sweep over mu in {0.1, 0.3, 0.7} picks 0.3, the default here.
    """
    m = as_probability(mean, "mean")
    eta = float(as_finite(eta, "eta", nonnegative=True))
    mu = float(as_finite(mu, "mu"))
    out = m * (1 - m) * np.exp(-eta * (m - mu) ** 2)
    return float(out) if np.ndim(out) == 0 else out


def insight_score(alpha, beta, K: int = 8, eta: float = 3.0, mu: float = 0.3):
    """INSIGHT's acquisition score A = w(alpha / (alpha + beta)) * I(R_1..K; phi) (eq. 16, chapter 9)."""
    a = as_finite(alpha, "alpha", positive=True)
    b = as_finite(beta, "beta", positive=True)
    return insight_weight(a / (a + b), eta, mu) * mutual_information(a, b, K)


def top_m(scores, M: int) -> np.ndarray:
    """Indices of the M largest scores, best first; ties go to the lower index (chapter 9)."""
    s = as_finite(scores, "scores")
    M = as_int(M, "M", minimum=0, maximum=s.size)
    order = np.lexsort((np.arange(s.size), -s))
    return order[:M]


def mopps_select(alpha, beta, M: int, rng: np.random.Generator, target: float = 0.5) -> np.ndarray:
    """MoPPS (Qu et al., 2025): draw phi_hat ~ Beta(alpha, beta) per candidate and keep the M whose
    draws are closest to ``target`` (chapter 9). Returns candidate indices."""
    a = np.atleast_1d(as_finite(alpha, "alpha", positive=True))
    b = np.atleast_1d(as_finite(beta, "beta", positive=True))
    target = float(as_probability(target, "target"))
    draws = rng.beta(a, b)
    return top_m(-((draws - target) ** 2), M)


class BetaBeliefs:
    """Per-prompt Beta-Bernoulli beliefs with an optional discount (chapter 9).

    ``alpha0``, ``beta0``: the prior; ``discount`` lambda in (0, 1]: 1 keeps all evidence, smaller
    values forget old evidence toward the prior each time a prompt is updated (MoPPS uses 0.5 on
    Countdown). Only the prompts passed to :meth:`update` change, as in INSIGHT and MoPPS.
    """

    def __init__(self, n_items: int, alpha0: float = 1.0, beta0: float = 1.0, discount: float = 1.0):
        self.n_items = as_int(n_items, "n_items", minimum=0)
        self.alpha0 = float(as_finite(alpha0, "alpha0", positive=True))
        self.beta0 = float(as_finite(beta0, "beta0", positive=True))
        discount = float(as_finite(discount, "discount"))
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must lie in (0, 1], got {discount}")
        self.discount = discount
        self.alpha = np.full(self.n_items, self.alpha0)
        self.beta = np.full(self.n_items, self.beta0)

    def update(self, idx, successes, trials) -> None:
        """Apply alpha <- lambda alpha + (1-lambda) alpha0 + S, beta likewise with K - S, for each
        prompt in ``idx`` (repeated indices are applied in order)."""
        idx = as_int_array(np.atleast_1d(idx), "idx", minimum=0)
        S = np.broadcast_to(as_finite(successes, "successes", nonnegative=True), idx.shape)
        K = np.broadcast_to(as_finite(trials, "trials", nonnegative=True), idx.shape)
        if (idx >= self.n_items).any():
            raise ValueError(f"idx must be < n_items ({self.n_items}), got {int(idx.max())}")
        if (S > K).any():
            raise ValueError("successes must not exceed trials")
        lam = self.discount
        for i, s, k in zip(idx, S, K):
            self.alpha[i] = lam * self.alpha[i] + (1 - lam) * self.alpha0 + s
            self.beta[i] = lam * self.beta[i] + (1 - lam) * self.beta0 + (k - s)

    @property
    def mean(self) -> np.ndarray:
        """Posterior mean alpha / (alpha + beta)."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def evidence(self) -> np.ndarray:
        """alpha + beta, the pseudo-count of observations (INSIGHT's n)."""
        return self.alpha + self.beta

    def sample(self, rng: np.random.Generator, idx=None) -> np.ndarray:
        """Thompson draws phi_hat ~ Beta(alpha, beta) for ``idx`` (all prompts by default)."""
        sel = slice(None) if idx is None else as_int_array(idx, "idx", minimum=0)
        return rng.beta(self.alpha[sel], self.beta[sel])

    def mutual_information(self, K: int, idx=None) -> np.ndarray:
        sel = slice(None) if idx is None else as_int_array(idx, "idx", minimum=0)
        return np.atleast_1d(mutual_information(self.alpha[sel], self.beta[sel], K))

    def state_dict(self) -> dict:
        return {"alpha": self.alpha.tolist(), "beta": self.beta.tolist(), "alpha0": self.alpha0,
                "beta0": self.beta0, "discount": self.discount}

    def load_state_dict(self, state: dict) -> None:
        alpha = np.asarray(state["alpha"], dtype=float)
        beta = np.asarray(state["beta"], dtype=float)
        if alpha.shape != (self.n_items,) or beta.shape != (self.n_items,):
            raise ValueError(f"state holds {alpha.shape[0]} beliefs, this object has {self.n_items}")
        self.alpha, self.beta = alpha, beta
        self.alpha0, self.beta0, self.discount = state["alpha0"], state["beta0"], state["discount"]
