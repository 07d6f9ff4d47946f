"""The GRPO baseline, ``uniform`` (chapter 5). The other strategies are registered in the module of
their parts (``dapo``, ``prefilter``, ``ada_seq``, ``ada_est``, ``gvm``, ``selection``, ``sage``,
``dro``); each configuration's docstring names its paper and chapter."""

from __future__ import annotations

from dataclasses import dataclass

from rlcurate.curation.base import Curator, Sampler, Selector
from rlcurate.curation.registry import StrategyConfig, register

__all__ = ["UniformConfig"]


@register("uniform")
@dataclass
class UniformConfig(StrategyConfig):
    """The GRPO baseline: B prompts per step in epoch order, ``group_size`` rollouts each (chapter 5)."""

    def build(self) -> Curator:
        return Curator(Selector(), Sampler(), name="uniform")
