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

    ``split="train"`` and ``"test"`` partition the prompts by ``test_fraction`` (a fixed seeded draw).
    A hint (chapter 7) is a level 1..3 written into the rendered prompt; the engine reads it back.
    """

    name = "sim"

    def __init__(self, world: SoftmaxWorld, test_fraction: float = 0.2, seed: int = 0):
        self.world = world
        order = np.random.default_rng(seed).permutation(world.n_prompts)
        n_test = int(round(test_fraction * world.n_prompts))
        self._ids = {"test": np.sort(order[:n_test]), "train": np.sort(order[n_test:])}
        self._problems = {
            split: [Problem(uid=f"sim/{i}", question=f"prompt {i}", answer="correct",
                            solution=("step 1", "step 2", "step 3"), meta={"prompt": int(i)})
                    for i in ids]
            for split, ids in self._ids.items()
        }

    def prompt_ids(self, split: str) -> np.ndarray:
        """World indices of the prompts of ``split``."""
        return self._ids[split]

    def problems(self, split: str = "train") -> list[Problem]:
        if split not in self._problems:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return self._problems[split]

    def messages(self, problem: Problem, hint: str | None = None) -> list[dict[str, str]]:
        return [{"role": "user", "content": problem.question}]

    def render(self, problem: Problem, tokenizer=None, hint: str | None = None) -> str:
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
        out = []
        for k, c in enumerate(counts):
            actions = rng.choice(probs.shape[1], size=c, p=probs[k]) if c else np.zeros(0, dtype=int)
            out.append([Completion(prompt_index=k, sample_index=j, prompt_token_ids=[], token_ids=[int(a)],
                                   text=str(int(a)), logprobs=[float(np.log(probs[k, a]))], finish_reason="stop")
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

    :meth:`update` is plain gradient ascent ``theta += lr * g`` with the token-mean estimator
    g = sum_j A_j w_j grad log pi(a_j | x_j) / (number of rollouts trained), exact policy-gradient
    machinery on a one-token "completion" (w_j: the mean of the completion's token weights).
    """

    tokenizer = None

    def __init__(self, world: SoftmaxWorld, theta: np.ndarray, lr: float = 0.5):
        self.world = world
        self.theta = np.array(theta, dtype=float)
        self.lr = float(lr)
        self.engine = SimEngine(world, self.theta)

    def generate(self, prompts, n, params, seed):
        self.engine.theta = self.theta
        return self.engine.generate(prompts, n, params, seed=seed)

    def grad_norms(self, group: Group) -> np.ndarray:
        """||grad log pi(a | x)|| for each completion of ``group`` (GVM's G_i, chapter 3), exact."""
        if not group.size:
            return np.zeros(0)
        idx = np.full(group.size, group.problem.meta["prompt"])
        actions = [c.token_ids[0] for c in group.completions]
        return np.linalg.norm(self.world.score(self.theta, idx, actions, group.hint_level), axis=1)

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
            self.theta = self.theta + self.lr * (np.asarray(coef) @ scores / len(prompt))
        return {"trained_samples": len(prompt)}


class SimTrainer:
    """Train the world's policy with a curation strategy (chapters 5-10): :func:`run_step` with a
    :class:`SimPolicy`, held-out quality the exact mean pass rate of the test prompts (no sampling
    noise)."""

    def __init__(self, world: SoftmaxWorld, curator: Curator, *, prompts_per_step: int = 32,
                 group_size: int = 8, lr: float = 0.5, advantage: str = "grpo", adv_eps: float = 1e-6,
                 seed: int = 0, test_fraction: float = 0.2, theta: np.ndarray | None = None):
        from rlcurate.rollout.base import SamplingParams

        self.world = world
        self.task = SimTask(world, test_fraction, seed)
        self.curator = curator
        self.train_problems = self.task.problems("train")
        self.test_ids = self.task.prompt_ids("test")
        self.curator.bind(len(self.train_problems), seed)
        self.policy = SimPolicy(world, world.init_theta() if theta is None else theta, lr)
        self.sampling = SamplingParams(max_new_tokens=1)
        self.B, self.n = prompts_per_step, group_size
        self.advantage, self.adv_eps, self.seed = advantage, adv_eps, seed
        self.step = 0
        self.rollouts = 0

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
                           group_size=self.n, prompts_per_step=self.B, policy=self.policy, sampling=self.sampling)

    def train_step(self) -> dict[str, Any]:
        out = run_step(self.curator, self.context(), self.policy, self.advantage, self.adv_eps)
        self.step += 1
        self.rollouts += out.counters.rollouts
        return {"step": self.step, "rollouts": out.counters.rollouts, "total_rollouts": self.rollouts,
                "effective_prompt_ratio": out.group_metrics()["effective_prompt_ratio"],
                "trained_samples": out.update["trained_samples"], "held_out": self.held_out(),
                **self.curator.metrics()}

    def run(self, steps: int) -> SimRunResult:
        result = SimRunResult([{"step": 0, "rollouts": 0, "total_rollouts": 0, "held_out": self.held_out(),
                                "effective_prompt_ratio": float("nan"), "trained_samples": 0}])
        for _ in range(steps):
            result.records.append(self.train_step())
        result.theta = self.theta.copy()
        return result
