"""The built-in strategies (registered by name). Each factory's docstring names its paper and chapter."""

from __future__ import annotations

from rlcurate.curation.base import Curator, Sampler, Selector
from rlcurate.curation.registry import register


@register("uniform")
def uniform() -> Curator:
    """The GRPO baseline: B prompts per step in epoch order, ``group_size`` rollouts each (chapter 5)."""
    return Curator(Selector(), Sampler(), name="uniform")
