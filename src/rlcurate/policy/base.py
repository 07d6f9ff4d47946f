"""What one training step needs from the model being trained (chapter 5, *The GRPO loop*).

A :class:`Policy` is the one thing the step loop (:func:`rlcurate.curation.step.run_step`) and the
curation strategies reach the model through. Two implementations exist: the language model being
trained (:class:`rlcurate.train.policy.LMPolicy`) and the simulated world's softmax policy
(:class:`rlcurate.sim.bridge.SimPolicy`). A strategy never holds either; it asks its
:class:`~rlcurate.curation.base.StepContext`, which asks the policy and counts what was spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from rlcurate.curation.base import Group
    from rlcurate.rollout.base import Completion, SamplingParams

__all__ = ["Policy", "SamplingPolicy"]


@runtime_checkable
class Policy(Protocol):
    """The model being trained, as a step sees it.

    ``tokenizer`` is the policy's tokenizer (``None`` in the simulated world, whose completions are
    one action each).
    """

    tokenizer: Any

    def generate(self, prompts: Sequence[str], n, params: "SamplingParams", seed: int) -> list[list["Completion"]]:
        """``n`` (a number, or one per prompt) completions of each rendered prompt, sampled at
        ``params`` with the engine seed ``seed`` (:meth:`rlcurate.rollout.RolloutEngine.generate`)."""
        ...

    def sequence_logprobs(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                          token_budget: int | None = None) -> list[np.ndarray]:
        """log pi(y_j | context, y_<j) of each continuation after its context, without gradients,
        in micro-batches of at most ``token_budget`` tokens (default: the policy's own)."""
        ...

    def sequence_logprobs_and_ranks(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                                    token_budget: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """As :meth:`sequence_logprobs`, with the rank of each continuation token under the policy
        (1: the most likely token) next to its log-probability (DRO's dataset filter, chapter 8)."""
        ...

    def grad_norms(self, group: "Group") -> np.ndarray:
        """||grad log pi(y | x)|| of each completion of ``group`` (GVM's G_i, chapter 3)."""
        ...

    def update(self, groups: Sequence["Group"], advantages: Sequence[np.ndarray]) -> dict[str, float]:
        """One optimizer step on the trained groups, each completion weighted by its advantage (and
        its group's token weights); returns the step's statistics (loss, gradient norm, ...)."""
        ...


class SamplingPolicy:
    """A policy that only samples, with a :class:`~rlcurate.rollout.RolloutEngine` (tests, notebooks,
    audits): no scores, no update."""

    def __init__(self, engine, tokenizer=None):
        self.engine = engine
        self.tokenizer = tokenizer

    def generate(self, prompts, n, params, seed):
        return self.engine.generate(prompts, n, params, seed=seed)
