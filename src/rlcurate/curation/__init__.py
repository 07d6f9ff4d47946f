"""Curation strategies (chapters 5-10): which prompts, how many rollouts, which samples to train on,
with what weight. See :mod:`rlcurate.curation.base` for the interface and
:mod:`rlcurate.curation.registry` for the names a training config uses; adding a strategy:
``src/rlcurate/curation/README.md``."""

from rlcurate.curation.base import Curator, Group, Processor, Sampler, Selector, StepContext, group_advantages
from rlcurate.curation.registry import StrategyConfig, available, build_curator, register

__all__ = ["Curator", "Group", "Processor", "Sampler", "Selector", "StepContext", "group_advantages", "available",
           "build_curator", "register", "StrategyConfig"]
