"""Reinforce-Ada-Seq and SAGE's hints around verl's rollout manager (appendix A2, *Scaling out with verl*).

verl 0.7.1's ``RayPPOTrainer.fit`` generates a step's responses with one call,
``self.async_rollout_manager.generate_sequences(gen_batch)``, on the step's prompts repeated ``rollout.n``
times (interleaved), and unites the result with the prompts repeated the same way. :class:`CuratedRollout`
stands in for that manager: it runs this package's own sampler and processors (chapters 6 and 7) in a step
context whose ``generate`` is the wrapped manager's ``generate_sequences`` on the rows the strategy asks for,
and returns exactly ``rollout.n`` rows per prompt, in the prompts' order, so ``fit()`` goes on unchanged:

* **Reinforce-Ada-Seq** (``ada_seq_balanced``, ``ada_seq_positive``): rounds of ``round_repeat`` responses for
  every prompt whose pool has not met the exit rule, then the released downsample to ``n`` rows; each row
  carries its prompt's pool statistics as ``batch["reward_baselines"] = (p_hat, N)``, which the advantage
  estimator ``rlcurate_pool_grpo`` (:mod:`rlcurate.interop.verl`) reads.
* **SAGE** and **SAGE-LIGHT** (``sage``, ``sage_light``, with the task's own hints): a hinted prompt's
  ``raw_prompt`` is the task's chat turns with the hint in the user turn (``task.messages(problem, hint)``;
  verl applies the chat template in the rollout), generated and trained on as SAGE does; each row's level is
  ``non_tensor_batch["hint_level"]``. SAGE-LIGHT's schedule (a prompt's level from its last visit) lives in this
  object across steps.

A curriculum sampler in front (:class:`rlcurate.interop.verl.CurationSampler`, INSIGHT by default) must learn
from what was generated, not from the rows kept (Ada-Seq's balanced downsample keeps n/2 positives whatever the
pass rate; a rescued prompt's kept rows are all hinted): each row of a prompt whose strategy set them carries
``non_tensor_batch["pool_successes"]`` and ``["pool_size"]``, its unhinted rollouts this step (Ada-Seq's whole
pool, SAGE's level-0 group), which the sampler's ``update`` reads as this package's trainer does (hinted groups
that SAGE generated and then replaced by a higher level are not passed on).

Rewards are read during the rounds from the wrapped manager's output, ``rm_scores`` summed over the response
(verl computes them in the agent loop when its reward loop is on), or from ``score(DataProto) -> rewards``.
Validation batches (``meta_info["validate"]``) pass through untouched, and every other attribute is the
wrapped manager's.

Usage, after ``trainer.init_workers()``::

    from rlcurate.interop.verl_rollout import CuratedRollout
    trainer.async_rollout_manager = CuratedRollout(trainer.async_rollout_manager, "ada_seq_balanced",
                                                   n=config.actor_rollout_ref.rollout.n)
    trainer.fit()        # with algorithm.adv_estimator=rlcurate_pool_grpo

With SAGE-LIGHT (whose schedule lives here across steps) pass ``curriculum=trainer.train_dataloader.sampler`` where
the dataloader's sampler is :class:`~rlcurate.interop.verl.CurationSampler`: the schedule then travels in the
sampler's state, which verl saves in each checkpoint's ``data.pt``; without it a resumed run starts every prompt
at level 0.

Tested with verl 0.7.1's ``DataProto`` and a stand-in for the manager (``tests/test_interop_verl_rollout.py``). verl
0.8 and later keep a step's data in TransferQueue and generate through their agent loop there; this wrapper is
for 0.7.1 (it refuses nothing by version, but only that one was tested).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Mapping

import numpy as np
import torch

from rlcurate.interop._core import HostedRow, check_task_hints, foreign_parts
from rlcurate.interop.verl import POOL_ADV_ESTIMATOR  # noqa: F401 - imports verl, registers the estimator

__all__ = ["CuratedRollout", "HOSTED_IN_VERL"]

HOSTED_IN_VERL = ("ada_seq_balanced", "ada_seq_positive", "sage", "sage_light")


def _curator(strategy, strategy_kwargs: dict | None):
    from rlcurate.curation import build_curator
    from rlcurate.curation.ada_seq import AdaSeqDownsample, AdaSeqSampler
    from rlcurate.curation.base import Curator, Selector
    from rlcurate.curation.sage import SageLightSampler, SageSampler

    curator = build_curator(strategy, **(strategy_kwargs or {})) if isinstance(strategy, str) else strategy
    if not isinstance(curator, Curator):
        raise ValueError(f"CuratedRollout takes a strategy name or a Curator, got {strategy!r}")
    name = curator.name
    if type(curator.selector) is not Selector:
        raise ValueError(f"strategy {name!r}: in verl the prompts are chosen by the dataloader; run the selector as "
                         f"the curriculum sampler (rlcurate.interop.verl.CurationSampler) and give CuratedRollout "
                         f"the response-level part alone ({', '.join(HOSTED_IN_VERL)})")
    foreign = foreign_parts(curator, (AdaSeqSampler, SageSampler, SageLightSampler, AdaSeqDownsample))
    if foreign is None or foreign:
        raise ValueError(f"strategy {name!r} cannot run around verl's rollout manager: "
                         + (f"{', '.join(foreign)} changes how many rows a prompt trains on or how they are "
                            f"weighted, which fit() cannot carry (DAPO: verl's own algorithm.filter_groups)"
                            if foreign else "it has no response-level part (use the curriculum sampler)")
                         + f"; CuratedRollout hosts {', '.join(HOSTED_IN_VERL)}")
    for p in curator.processors:
        if isinstance(p, AdaSeqDownsample) and (p.correction != "none" or p.reweight_classes):
            raise ValueError(f"strategy {name!r}: verl's advantage estimator reads (p_hat, N) per row and no "
                             f"weight, so correction={p.correction!r} and reweight_classes={p.reweight_classes} "
                             f"cannot reach the loss; use correction='none', reweight_classes=False")
    return curator


class CuratedRollout:
    """verl's rollout manager with one of this package's response-level strategies around its
    ``generate_sequences`` (module docstring).

    Args:
        inner: the manager (``trainer.async_rollout_manager``); any object with ``generate_sequences``.
        strategy: ``ada_seq_balanced``, ``ada_seq_positive``, ``sage``, ``sage_light`` or such a ``Curator``.
        n: ``actor_rollout_ref.rollout.n``, the rows per prompt ``fit()`` expects.
        strategy_kwargs: the strategy's keyword arguments.
        task, problems: SAGE's hints: an rlcurate task and ``{row index: Problem}`` for the dataset's
            ``index_key`` values (the task's ``messages`` and ``hint`` write the hinted prompts).
        score: ``score(DataProto) -> rewards per row``; default: ``rm_scores`` summed over the response.
        index_key: the non-tensor field naming each row's prompt (verl's ``index``).
        curriculum: the curriculum sampler (``trainer.train_dataloader.sampler``, a
            :class:`~rlcurate.interop.verl.CurationSampler`) whose state, saved by verl in every checkpoint's
            ``data.pt``, carries this strategy's state too (SAGE-LIGHT's levels), so a resumed run keeps it.
    """

    def __init__(self, inner, strategy, n: int, strategy_kwargs: dict | None = None, task=None,
                 problems: Mapping[Any, Any] | None = None, score: Callable | None = None, index_key: str = "index",
                 curriculum=None):
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ValueError(f"n must be rollout.n, a positive integer; got {n!r}")
        self.inner, self.n, self.score, self.index_key = inner, int(n), score, index_key
        self.curator = _curator(strategy, strategy_kwargs)
        sampler = self.curator.sampler
        m = getattr(sampler, "round_repeat", self.n)
        if m < self.n:
            raise ValueError(f"strategy {self.curator.name!r}: round_repeat {m} < rollout.n {self.n} can leave a "
                             f"prompt with fewer than n responses, and fit() unites exactly n rows per prompt")
        self.task, self.problems = task, problems
        if hasattr(sampler, "hints"):
            if task is None or problems is None:
                raise ValueError(f"strategy {self.curator.name!r} around verl needs task= and problems= (the task's "
                                 f"hints and chat turns write the hinted raw_prompt)")
            check_task_hints(sampler.hints, task, f"strategy {self.curator.name!r} around verl", chat_turns=True)
        self.step_log: list[dict] = []
        if curriculum is not None:
            curriculum.attach(self)

    def state_dict(self) -> dict[str, Any]:
        """The strategy's sampler and processors (SAGE-LIGHT's levels), as JSON values."""
        return self.curator.rollout_state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curator.load_rollout_state_dict(state)

    def __getattr__(self, name):  # start_profile, wake_up, ...: the wrapped manager's
        if name in ("inner", "curator"):  # not yet set (during __init__ or unpickling): not the manager's
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ one step
    def generate_sequences(self, prompts):
        from verl import DataProto

        if prompts.meta_info.get("validate", False):
            return self.inner.generate_sequences(prompts)
        n = self.n
        if len(prompts) % n:
            raise ValueError(f"CuratedRollout got {len(prompts)} rows, not a multiple of rollout.n = {n}")
        first = prompts[::n]
        ids = [self._id(x) for x in first.non_tensor_batch[self.index_key]]
        step = _Step(self, first, ids)
        ctx = SimpleNamespace(step=prompts.meta_info.get("global_steps", len(self.step_log)), prompts_per_step=len(ids),
                              group_size=n, generate=step.generate, task=self.task, problems=self.problems,
                              tokenizer=None, render=None)
        groups = self.curator.sampler.rollout(ctx, ids)
        kept = self.curator.process(ctx, groups)
        for part in [self.curator.sampler, *self.curator.processors]:
            part.observe(ctx, kept)
        if [g.index for g in kept] != ids or any(g.size != n for g in kept):
            raise RuntimeError(f"strategy {self.curator.name!r} kept {[(g.index, g.size) for g in kept]}, not {n} rows "
                               f"of each of {ids} in order")
        rows = [step.outputs[c.call][c.row:c.row + 1] for g in kept for c in g.completions]
        for row in rows:  # concat() refuses rows whose meta_info differ; the output gets the last call's below
            row.meta_info = {}
        out = DataProto.concat(rows)
        if all(g.baseline is not None and g.pool_size for g in kept):
            out.batch["reward_baselines"] = torch.tensor([[g.baseline, float(g.pool_size)] for g in kept
                                                          for _ in range(n)], dtype=torch.float32)
        if hasattr(self.curator.sampler, "hints"):
            out.non_tensor_batch["hint_level"] = np.array([g.hint_level for g in kept for _ in range(n)], dtype=np.int64)
        if any(g.pool_size for g in kept):  # what a curriculum sampler in front learns from (CurationSampler.update)
            out.non_tensor_batch["pool_successes"] = np.array([float(g.pool_successes or 0.0) for g in kept
                                                               for _ in range(n)], dtype=np.float64)
            out.non_tensor_batch["pool_size"] = np.array([int(g.pool_size or 0) for g in kept for _ in range(n)],
                                                         dtype=np.int64)
        out.meta_info = {**step.meta_info, "timing": step.timing,
                         "rlcurate/generated": sum(g.generated for g in groups), "rlcurate/calls": len(step.outputs)}
        self.step_log.append({"generated": [(g.index, g.generated) for g in groups], "calls": len(step.outputs),
                              "hint_levels": [g.hint_level for g in kept]})
        return out

    @staticmethod
    def _id(value):
        return value.item() if hasattr(value, "item") else value


class _Step:
    """One ``generate_sequences`` of :class:`CuratedRollout`: the generation calls the strategy made."""

    def __init__(self, host: CuratedRollout, first, ids: list):
        self.host, self.first = host, first
        self.row_of = {}
        for row, i in enumerate(ids):
            self.row_of.setdefault(i, row)
        self.outputs: list = []
        self.timing: dict[str, float] = {}
        self.meta_info: dict = {}

    def generate(self, indices, m, hints=None, hint_levels=None, hint_mode=None) -> list:
        """``m`` responses of each prompt in ``indices`` (dataset ids), hinted where ``hints[k]`` is set."""
        from rlcurate.curation.base import Group

        host = self.host
        indices = [host._id(i) for i in indices]
        levels = list(hint_levels) if hint_levels is not None else [0] * len(indices)
        hints = list(hints) if hints is not None else [None] * len(indices)
        batch = self.first.select_idxs([self.row_of[i] for i in indices])
        if any(h is not None for h in hints):
            raw = batch.non_tensor_batch["raw_prompt"].copy()
            for k, (i, h) in enumerate(zip(indices, hints)):
                if h is not None:
                    raw[k] = host.task.messages(host.problems[i], h)
            batch.non_tensor_batch["raw_prompt"] = raw
        out = host.inner.generate_sequences(batch.repeat(repeat_times=int(m), interleave=True))
        for key, value in out.meta_info.pop("timing", {}).items():  # concat() wants equal meta_info
            self.timing[key] = self.timing.get(key, 0.0) + float(value)
        self.meta_info = dict(out.meta_info)
        rewards = self._rewards(out)
        call = len(self.outputs)
        self.outputs.append(out)
        groups = []
        for k, i in enumerate(indices):
            r = rewards[k * m:(k + 1) * m]
            groups.append(Group(index=i, problem=host.problems[i] if host.problems else None,
                                prompt=str(hints[k] or ""), completions=[HostedRow(call, k * m + j) for j in range(m)],
                                rewards=r, generated=int(m), hint_level=int(levels[k])))
        return groups

    def _rewards(self, out) -> np.ndarray:
        if self.host.score is not None:
            r = self.host.score(out)
        elif "rm_scores" in out.batch.keys():
            r = out.batch["rm_scores"].sum(dim=-1)
        else:
            raise ValueError("CuratedRollout needs each response's reward during the rounds: turn on verl's reward "
                             "loop (rm_scores in the rollout output) or pass score=")
        r = np.asarray(r.detach().cpu().numpy() if torch.is_tensor(r) else r, dtype=float).reshape(-1)
        if r.size != len(out) or not np.all(np.isfinite(r)):
            raise ValueError(f"CuratedRollout: the rewards of a generation call must be {len(out)} finite numbers")
        return r
