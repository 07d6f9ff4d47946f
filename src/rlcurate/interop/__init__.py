"""rlcurate's curation strategies inside other trainers (appendix A2, *Scaling out with verl*).

=====================================  ==================================================================
:mod:`rlcurate.interop.trl`            :class:`~rlcurate.interop.trl.CurationSampler` (TRL's
                                       ``RepeatSampler`` contract) and
                                       :class:`~rlcurate.interop.trl.CuratedGRPOTrainer`, which feeds
                                       TRL's rewards back to the strategy
:mod:`rlcurate.interop.trl_skip`       :class:`~rlcurate.interop.trl_skip.ZeroAdvantageSkipping`, a
                                       ``GRPOTrainer`` mixin that trains without the zero-advantage rows,
                                       the update unchanged (``skip_zero_advantage``)
:mod:`rlcurate.interop.verl`           :class:`~rlcurate.interop.verl.CurationSampler`, a verl
                                       ``AbstractCurriculumSampler`` (``data.sampler.class_path``,
                                       verl 0.5 to 0.7.1)
:mod:`rlcurate.interop.verl_rollout`   :class:`~rlcurate.interop.verl_rollout.CuratedRollout`, Reinforce-Ada-Seq
                                       and SAGE around verl 0.7.1's rollout manager
:mod:`rlcurate.interop.verl_v1`        :class:`~rlcurate.interop.verl_v1.CuratedPPOTrainer`, verl's v1
                                       trainer registered as ``rlcurate_curated`` with that sampler,
                                       SAGE-LIGHT's hints and ``skip_zero_advantage`` (verl 0.8 and
                                       later; tested on 0.9.1)
:mod:`rlcurate.interop.verl_skip`      the plan behind ``skip_zero_advantage``: which rows, the advantage
                                       factor that keeps the loss's normaliser, when it is exact
:class:`PromptSelection`               the adapter both share: a strategy's ``select`` and ``observe``
                                       driven by another trainer, with checkpointable state
=====================================  ==================================================================

Only prompt-level strategies (INSIGHT, MoPPS, expected difficulty, inverse evidence, the variance
prefilter from an audit file, uniform) are samplers; the response-level ones run around the other
trainer's generation (TRL's generate-and-score call, verl's rollout manager) where it can host them
(appendix A2). The submodules import TRL and verl lazily: importing this package needs neither.
"""

from rlcurate.interop._core import PROMPT_LEVEL_STRATEGIES, PromptSelection, resolve_selector

__all__ = ["PromptSelection", "resolve_selector", "PROMPT_LEVEL_STRATEGIES"]
