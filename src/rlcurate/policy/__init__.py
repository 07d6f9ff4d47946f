"""The policy layer (chapter 5): what a step asks of the model being trained.

It sits under both :mod:`rlcurate.curation` and :mod:`rlcurate.train`: the :class:`Policy` protocol
the step loop and the strategies use, the :class:`TrainSample` a language-model step trains on, its
micro-batch planning, and the scoring of token sequences (log-probabilities, per-completion gradient
norms). :mod:`rlcurate.policy.base` and :mod:`rlcurate.policy.batching` import without torch.
"""

from rlcurate.policy.base import Policy
from rlcurate.policy.batching import TrainSample, plan_micro_batches

__all__ = ["Policy", "TrainSample", "plan_micro_batches"]
