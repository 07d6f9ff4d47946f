"""The simulated world behind the same interfaces as a language model (chapters 5-10).

:class:`SimTask` is a :class:`~rlcurate.tasks.base.Task` whose problems are the world's prompts and
:class:`SimEngine` a :class:`~rlcurate.rollout.base.RolloutEngine` that samples answers from the
world's softmax policy at parameters ``theta``. A curation strategy therefore runs unchanged on the
simulated world (thousands of steps in seconds, exact pass rates) and on a real model.

:class:`SimPolicy` is the world's softmax policy as a :class:`~rlcurate.policy.base.Policy`: it samples
with the engine and updates ``theta`` with the exact score function of the world,
grad log pi(a | x) = phi_{x,a} - phi_bar_x. :class:`SimTrainer` runs the same step as the language-model
trainer (:func:`rlcurate.curation.step.run_step`) with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlcurate.curation.base import Curator, Group, StepContext
from rlcurate.curation.step import run_step
from rlcurate.rollout.base import Completion, RolloutEngine
from rlcurate.sim.world import SoftmaxWorld
from rlcurate.tasks.base import Problem, Reward, Task

__all__ = ["SimTask", "SimEngine", "SimPolicy", "SimTrainer", "SimRunResult"]


class SimTask(Task):
    """The world's prompts as problems; a completion's text is the index of the chosen answer.

    ``split="train"``, ``"test"`` and ``"validation"`` partition the prompts by ``test_fraction`` and
    ``validation_fraction`` (a fixed seeded draw; the validation prompts, for choosing a learning rate
    without looking at the test prompts (chapter 10), come from the train side, and with the default
    ``validation_fraction=0`` the train and test splits are those of earlier versions).
    A hint (chapter 7) is a level 1..3 written into the rendered prompt; the engine reads it back.
    """

    name = "sim"

    def __init__(self, world: SoftmaxWorld, test_fraction: float = 0.2, seed: int = 0,
                 validation_fraction: float = 0.0):
        self.world = world
        order = np.random.default_rng(seed).permutation(world.n_prompts)
        n_test = int(round(test_fraction * world.n_prompts))
        n_val = int(round(validation_fraction * world.n_prompts))
        if n_test + n_val >= world.n_prompts:
            raise ValueError(f"test_fraction + validation_fraction must leave training prompts, got "
                             f"{test_fraction} + {validation_fraction}")
        self._ids = {"test": np.sort(order[:n_test]), "validation": np.sort(order[n_test:n_test + n_val]),
                     "train": np.sort(order[n_test + n_val:])}
        self._problems = {
            split: [Problem(uid=f"sim/{i}", question=f"prompt {i}", answer="correct",
                            solution=("step 1", "step 2", "step 3"), meta={"prompt": int(i)})
                    for i in ids]
            for split, ids in self._ids.items()
        }

    def prompt_ids(self, split: str) -> np.ndarray:
        """World indices of the prompts of ``split``."""
        if split not in self._ids:
            raise ValueError(f"split must be 'train', 'test' or 'validation', got {split!r}")
        return self._ids[split]

    def problems(self, split: str = "train") -> list[Problem]:
        if split not in self._problems:
            raise ValueError(f"split must be 'train', 'test' or 'validation', got {split!r}")
        return self._problems[split]

    def messages(self, problem: Problem, hint: str | None = None) -> list[dict[str, str]]:
        return [{"role": "user", "content": problem.question}]

    # the level is read back from the hint's text, so where a hint "goes" makes no difference here
    hint_modes = ("prefix", "user")

    def render(self, problem: Problem, tokenizer=None, hint: str | None = None, hint_mode: str | None = None) -> str:
        level = 0 if not hint else int(hint.count("step"))
        return f"{problem.meta['prompt']}|{level}"

    def hint(self, problem: Problem, level: int) -> str:
        """The hint of ``level`` (1-3): the first ``level`` reference steps, as for the tiny model."""
        return problem.reveal(level)

    def _score(self, problem: Problem, completion: str) -> Reward:
        ok = int(completion) < self.world.n_correct
        return Reward(1.0 if ok else 0.0, "correct" if ok else "wrong answer")


class SimEngine(RolloutEngine):
    """Samples answers of the simulated world at parameters ``theta`` (set it before each step)."""

    def __init__(self, world: SoftmaxWorld, theta: np.ndarray):
        self.world = world
        self.theta = theta

    def _generate(self, prompts, counts, params, seed, progress):
        rng = np.random.default_rng(seed)
        parsed = [tuple(int(x) for x in p.split("|")) for p in prompts]
        idx = np.array([i for i, _ in parsed], dtype=np.int64)
        levels = np.array([lv for _, lv in parsed], dtype=float)
        probs = self.world.probs(self.theta, idx, levels) if len(idx) else np.zeros((0, 1))
        # numpy's Generator.choice(size=c, p=row), row by row, in one pass: the same uniforms from the same
        # stream, the same normalised cumulative sums, the same searchsorted
        cdf = np.cumsum(probs, axis=1)
        cdf /= cdf[:, -1:]
        uniforms = rng.random(int(sum(counts)))
        out, start = [], 0
        for k, c in enumerate(counts):
            actions = cdf[k].searchsorted(uniforms[start:start + c], side="right").tolist()
            start += c
            out.append([Completion(prompt_index=k, sample_index=j, prompt_token_ids=[], token_ids=[a],
                                   text=str(a), logprobs=[float(np.log(probs[k, a]))], finish_reason="stop")
                        for j, a in enumerate(actions)])
        return out


@dataclass
class SimRunResult:
    """A simulated training run: per-step records (held-out mean pass rate, rollouts used, ...)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    theta: np.ndarray | None = None

    def column(self, key: str) -> np.ndarray:
        return np.array([r[key] for r in self.records])


class SimPolicy:
    """The world's softmax policy at parameters ``theta`` (:class:`~rlcurate.policy.base.Policy`).

    :meth:`update` follows the token-mean estimate
    g = sum_j A_j w_j grad log pi(a_j | x_j) / (number of rollouts trained), exact policy-gradient
    machinery on a one-token "completion" (w_j: the mean of the completion's token weights), with
    ``optimizer``:

    * ``"sgd"``: plain gradient ascent ``theta += lr * g`` (chapters 5-9; the step grows with |A|);
    * ``"adam"``: the language-model trainer's optimizer: the global norm of g clipped to
      ``grad_clip``, then Adam with the trainer's betas (0.9, 0.99), eps 1e-8 and bias correction,
      whose step is insensitive to the scale of the advantages (chapter 10).
    """

    tokenizer = None

    def __init__(self, world: SoftmaxWorld, theta: np.ndarray, lr: float = 0.5, optimizer: str = "sgd",
                 betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-8, grad_clip: float = 1.0):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        self.world = world
        self.theta = np.array(theta, dtype=float)
        self.lr = float(lr)
        self.optimizer, self.betas, self.eps, self.grad_clip = optimizer, betas, eps, grad_clip
        self._m = np.zeros_like(self.theta)
        self._v = np.zeros_like(self.theta)
        self._t = 0
        self.engine = SimEngine(world, self.theta)
        self.sampled_tokens = 0
        """Every token this policy has sampled, whoever asked: the contract compares it with what the
        step's counters charged (a rollout drawn around ``ctx.generate`` shows up here alone)."""

    def _step(self, g: np.ndarray) -> None:
        if self.optimizer == "sgd":
            self.theta = self.theta + self.lr * g
            return
        norm = float(np.linalg.norm(g))
        if self.grad_clip > 0 and norm > self.grad_clip:
            g = g * (self.grad_clip / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_'s coefficient
        b1, b2 = self.betas
        self._t += 1
        self._m = b1 * self._m + (1 - b1) * g
        self._v = b2 * self._v + (1 - b2) * g * g
        m_hat, v_hat = self._m / (1 - b1 ** self._t), self._v / (1 - b2 ** self._t)
        self.theta = self.theta + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def generate(self, prompts, n, params, seed):
        self.engine.theta = self.theta
        out = self.engine.generate(prompts, n, params, seed=seed)
        self.sampled_tokens += sum(len(c.token_ids) for comps in out for c in comps)
        return out

    def grad_norms(self, group: Group) -> np.ndarray:
        """||grad log pi(a | x)|| for each completion of ``group`` (GVM's G_i, chapter 3), exact."""
        if not group.size:
            return np.zeros(0)
        idx = np.full(group.size, group.problem.meta["prompt"])
        actions = [c.token_ids[0] for c in group.completions]
        return np.linalg.norm(self.world.score(self.theta, idx, actions, group.hint_level), axis=1)

    def pass_rates(self, problems) -> np.ndarray:
        """The exact current pass rate p_i(theta) of each problem (the oracle arms of chapter 11)."""
        idx = [p.meta["prompt"] for p in problems]
        return self.world.pass_rates(self.theta, idx) if idx else np.zeros(0)

    def update(self, groups, advantages) -> dict[str, Any]:
        prompt, action, level, coef = [], [], [], []
        for g, adv in zip(groups, advantages):
            world_idx = g.problem.meta["prompt"]
            for k, comp in enumerate(g.completions):
                tw = 1.0 if g.token_weights is None else float(np.asarray(g.token_weights[k]).mean())
                prompt.append(world_idx)
                action.append(comp.token_ids[0])
                level.append(g.hint_level)
                coef.append(adv[k] * tw)
        if prompt:
            scores = self.world.score(self.theta, prompt, action, level)
            self._step(np.asarray(coef) @ scores / len(prompt))
        return {"kept_samples": len(prompt)}


class SimTrainer:
    """Train the world's policy with a curation strategy (chapters 5-10): :func:`run_step` with a
    :class:`SimPolicy`, held-out quality the exact mean pass rate of the ``eval_split`` prompts (no
    sampling noise). ``optimizer`` is the policy's (``"sgd"`` or the trainer's ``"adam"``);
    ``eval_split="validation"`` (with ``validation_fraction > 0``) reads prompts disjoint from the test
    split, for choosing a learning rate; ``order_offset`` changes only the curator's random stream
    (its prompt order), as the language-model trainer's does for the A/A control."""

    def __init__(self, world: SoftmaxWorld, curator: Curator, *, prompts_per_step: int = 32,
                 group_size: int = 8, lr: float = 0.5, advantage: str = "grpo", adv_eps: float = 1e-6,
                 seed: int = 0, test_fraction: float = 0.2, theta: np.ndarray | None = None,
                 optimizer: str = "sgd", validation_fraction: float = 0.0, eval_split: str = "test",
                 order_offset: int = 0):
        from rlcurate.curation.base import GROUP_ADVANTAGES
        from rlcurate.rollout.base import SamplingParams

        if advantage not in GROUP_ADVANTAGES:
            raise ValueError(f"advantage must be one of {', '.join(GROUP_ADVANTAGES)}, got {advantage!r}")
        self.world = world
        self.task = SimTask(world, test_fraction, seed, validation_fraction)
        self.curator = curator
        self.train_problems = self.task.problems("train")
        self.test_ids = self.task.prompt_ids(eval_split)
        if not len(self.test_ids):
            raise ValueError(f"eval_split {eval_split!r} has no prompts (validation needs validation_fraction > 0)")
        self.curator.bind(len(self.train_problems), seed + order_offset)  # the A/A control's other order
        self.policy = SimPolicy(world, world.init_theta() if theta is None else theta, lr, optimizer)
        self.sampling = SamplingParams(max_new_tokens=1)
        self.B, self.n = prompts_per_step, group_size
        self.advantage, self.adv_eps, self.seed, self.order_offset = advantage, adv_eps, seed, order_offset
        self.step = 0
        self.rollouts = 0
        self.generated_tokens = 0  # charged: rollouts' tokens and text a strategy wrote for itself
        self.uncharged_rollouts = 0  # an oracle arm's free pass-rate estimates
        self.sampled_prompts: list[list[int]] = []  # per step, the pool indices rolled out

    @property
    def theta(self) -> np.ndarray:
        return self.policy.theta

    @theta.setter
    def theta(self, value) -> None:
        self.policy.theta = np.array(value, dtype=float)

    @property
    def lr(self) -> float:
        return self.policy.lr

    def held_out(self) -> float:
        """Mean pass rate of the held-out prompts, exact."""
        return float(self.world.pass_rates(self.theta, self.test_ids).mean())

    def context(self) -> StepContext:
        return StepContext(step=self.step, seed=self.seed, problems=self.train_problems, task=self.task,
                           group_size=self.n, prompts_per_step=self.B, policy=self.policy, sampling=self.sampling,
                           curator_seed=self.seed + self.order_offset)

    def train_step(self) -> dict[str, Any]:
        out = run_step(self.curator, self.context(), self.policy, self.advantage, self.adv_eps)
        self.sampled_prompts.append([int(g.index) for g in out.sampled])
        self.step += 1
        self.rollouts += out.counters.rollouts
        self.generated_tokens += out.counters.generated_tokens
        self.uncharged_rollouts += out.counters.uncharged_rollouts
        return {"step": self.step, "rollouts": out.counters.rollouts, "total_rollouts": self.rollouts,
                "effective_prompt_ratio": out.group_metrics()["effective_prompt_ratio"],
                "kept_samples": out.update["kept_samples"],
                "mixed_samples": sum(g.size for g in out.trained if g.mixed), "held_out": self.held_out(),
                **self.curator.metrics()}

    def run(self, steps: int) -> SimRunResult:
        result = SimRunResult([{"step": 0, "rollouts": 0, "total_rollouts": 0, "held_out": self.held_out(),
                                "effective_prompt_ratio": float("nan"), "kept_samples": 0}])
        for _ in range(steps):
            result.records.append(self.train_step())
        result.theta = self.theta.copy()
        return result
