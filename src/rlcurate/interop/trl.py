"""rlcurate's prompt selection inside TRL's ``GRPOTrainer`` (appendix A1, *Benchmarks*; appendix A2).

Two pieces:

:class:`CurationSampler`
    a drop-in for TRL's ``RepeatSampler``. Per generation batch it asks the strategy for
    ``batch_size = generation_batch_size // num_generations`` distinct prompts, yields each prompt
    index ``num_generations`` times in a row (one GRPO group), and yields the whole chunk
    ``repeat_count = num_iterations * steps_per_generation`` times (TRL generates on the first pass and
    reuses the completions on the others). Every rank builds the same sampler with the same seed and
    observes the same (gathered) rewards, so every rank yields the same stream, as TRL requires
    (tested with two CPU processes under ``torchrun``).

:class:`CuratedGRPOTrainer`
    a ``GRPOTrainer`` that installs the sampler (``_get_train_sampler``) and feeds the rewards back:
    after TRL has scored a generation batch (``_calculate_rewards``, which already gathers the rewards
    of all processes), the prompt index of every completion is gathered the same way
    (``accelerate.utils.gather_object``) and the strategy observes (index, weighted reward) pairs. The
    prompt index travels with the data in a dataset column (``index_column``, added when missing), so
    the feedback does not depend on the order in which the dataloader fetched the batches.

When does the strategy see the rewards? The Hugging Face loop fetches a whole gradient-accumulation
window of batches at the start of an optimizer step, and accelerate's ``DataLoaderShard`` fetches one
batch beyond the batch it yields (to detect the end of an epoch). A chunk of prompts is chosen when
its first batch is fetched, so with R = ``num_iterations * steps_per_generation`` passes per chunk and
A = ``gradient_accumulation_steps``, selection sees every earlier batch's rewards only when R > A.
TRL's defaults (``steps_per_generation = A``, ``num_iterations = 1``) give R = A and a lag of one
generation batch: batch b + 1 is chosen from the rewards of batches 0..b - 1. Measured on this CPU
(``tests/test_interop_trl.py`` records how many batches each selection had seen): lag 1 for
(A, R) = (1, 1) and (2, 2); 0 for (1, 2), (1, 2 via num_iterations) and (2, 4); 1 and 2 alternating
for (2, 1). The beliefs themselves miss nothing: every scored completion is observed, lag or not.

Usage::

    from rlcurate.interop.trl import CuratedGRPOTrainer
    trainer = CuratedGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=ds,
                                 strategy="insight", strategy_kwargs={"mu": 0.3})
    trainer.train()
    trainer.curation.selector.beliefs.alpha   # what INSIGHT learned

**Response-level strategies TRL can host** (:func:`hosted_parts`): DAPO's dynamic sampling (``dapo``) and
Reinforce-Ada-Seq (``ada_seq_balanced``, ``ada_seq_positive``) and SAGE's hints (``sage``, ``sage_light``, with
``task=``), alone or after a selector (``insight+dapo``). TRL has no hook for them (dynamic sampling is
huggingface/trl#3708), so :class:`CuratedGRPOTrainer` overrides ``_generate_and_score_completions`` and runs this
package's own sampler and processors (chapters 6 and 7) in a step context (:class:`_Rounds`) whose ``generate`` is
TRL's own generation and scoring: the dataloader's batch names the step's prompts, and every group the strategy asks
for (the chunk's, DAPO's extra generation batches chosen by the selector's rule, Ada-Seq's rounds for the prompts still
active, a prompt at a SAGE hint level rendered by the task with its hint) is one of TRL's generate-and-score calls,
so its reward functions, vLLM and metrics apply unchanged, and every rank takes the same decisions from the rewards
TRL gathers. The kept rows are then
gathered from whichever process generated them (``accelerate.utils.gather_object``) and dealt out again,
``len(inputs)`` rows per process, so a group that spanned two processes arrives whole. Advantages are this package's
(:func:`rlcurate.curation.base.group_advantages`: GRPO for ``scale_rewards="group"``, Dr. GRPO's r - baseline for
"none"; Ada-Seq's pool baseline p_hat; TRL's eps 1e-4). TRL trains fixed-size batches: where a strategy keeps fewer
than B groups of ``num_generations`` (DAPO at its cap), the batch is filled with rows whose completion mask is
zeroed, so they carry no token into the loss, as this package trains on what it found. Ada-Seq's ``round_repeat``
must be a multiple of ``num_generations`` (TRL generates whole groups; the released script's 8 and 4 are).

**DRO** (chapter 8; ``dro``, ``insight+dro``, with ``task=``) runs as this package's processor on the step's groups:
their rows carry the prompt and completion token ids TRL generated and the text as this package decodes it, and
``ctx.sequence_logprobs`` teacher-forces each problem's reference answer after each completion's reasoning on TRL's
current model with this package's scoring (each process scores its share; all are gathered). R3 as the reward
(``use_as="reward"``/``"both"``) enters the advantages; the group filter (``filter_fraction``) drops groups like
DAPO (filled rows); the token weights (``"token_weights"``/``"both"``) reach TRL's loss as advantages of shape
(B, T), A_i * w_it, which TRL's ``_compute_loss`` takes as they are: for w >= 0 its per-token loss
-min(rho A w, clip(rho) A w) is w times the unweighted one, and its KL term stays unweighted, as in this package's
:func:`rlcurate.train.loss.policy_loss`. This package's ``loss_agg`` maps onto TRL's ``loss_type``
(:data:`LOSS_TYPE_OF`): token-mean = ``dapo``, seq-mean-token-mean = ``grpo``, seq-mean-token-sum-norm =
``dr_grpo`` (token-level ratios); the others (``bnpo`` normalises per micro-batch; ``cispo``, ``sapo``, ``vespo``,
``luspo`` are other surrogates) and ``importance_sampling_level="sequence"`` are refused with token weights. Where
a step keeps fewer than B groups (the filter), ``grpo`` and ``dr_grpo`` count the filled rows in their per-sequence
mean and this package does not (``dapo`` is exact): use ``loss_type="dapo"`` with ``filter_fraction``. The paper's
dataset-level query filter (``dro_filter``, ``dro_filter+dro``) stays refused: it generates N rollouts of every
candidate query before it chooses, and TRL's sampler draws the prompts ahead of the step without generating.

The prefilter takes the audit's ``mixed.jsonl`` (``strategy_kwargs={"audit_file": ...}``) and matches
its uids against a dataset column (``uid_column``, default ``"uid"``; positions when absent).

Resuming from a TRL checkpoint: the sampler's state is saved as ``rlcurate_sampler.json`` in each
checkpoint folder (a hosted strategy's sampler and processors, SAGE-LIGHT's levels for instance, as
``rlcurate_curator.json``) and restored by ``train(resume_from_checkpoint=...)``, with the chunks the dataloader's
look-ahead had chosen but training had not reached, and, for a checkpoint within a generation batch
(``num_iterations`` > 1, or ``steps_per_generation`` > ``gradient_accumulation_steps``), TRL's buffer of the batch's
completions and its micro-step count (``rlcurate_generation_<rank>.pt``). The batches the loop skips on resume are
placeholders the sampler yields without selecting, and the loop restores the generators after them, so the resumed
run generates, selects and trains as the uninterrupted one (tested: same prompts, rewards, beliefs and parameters).
With ``ignore_data_skip=True`` a run resumed from a checkpoint at an epoch's end is the uninterrupted run (tested);
from one within an epoch it trains the same prompts, and the same completions until its first epoch ends (it runs
an epoch's worth of chunks from the checkpoint, the one in flight counted with the passes it had left, so later
epochs start, and the dataloader draws its seed from the generators, at other steps). ``dataloader_num_workers``
must be 0 (workers would select ahead).

With a hosted strategy the selector observes once per step, after the sampler and processors have run, every row
of every generate-and-score call of the step (its discount applied once; ``evidence="trained"`` reads the kept
groups with their pool statistics), and DAPO's top-ups come from the selector's ``more`` with the step's prompts
left out, as in this package's step. TRL's own logs of a call (``advantages`` in the completions table,
``frac_reward_zero_std``) describe the generated rows, not the trained ones.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from rlcurate.interop._core import (PROMPT_LEVEL_STRATEGIES, HostedRow, PromptSelection, check_task_hints,
                                   foreign_parts, problems_by_uid, resolve_selector)
from rlcurate.interop.trl_skip import ZeroAdvantageSkipping

__all__ = ["CurationSampler", "CuratedGRPOTrainer", "SAMPLER_STATE_FILE", "CURATOR_STATE_FILE", "selection_lag", "hosted_parts",
           "LOSS_TYPE_OF"]

_PROMPT_SIDE = ("prompt_ids", "prompt_mask")  # left-padded; every other per-row tensor of width > 1 is right-padded
_TEXT_ONLY = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
              "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask",
              "num_items_in_batch")
SAMPLER_STATE_FILE = "rlcurate_sampler.json"
CURATOR_STATE_FILE = "rlcurate_curator.json"  # a hosted strategy's sampler and processors
GENERATION_STATE_FILE = "rlcurate_generation_{rank}.pt"  # per process: TRL's buffer within a generation batch


def hosted_parts(strategy, strategy_kwargs: dict | None = None):
    """What of a strategy TRL's ``GRPOTrainer`` can host: ``(prompt selector, curator or None)``.

    A prompt-level strategy (:data:`PROMPT_LEVEL_STRATEGIES`) runs as the sampler alone (curator None). A strategy
    whose sampler and processors TRL can host (:data:`HOSTED_SAMPLERS`, :data:`HOSTED_PROCESSORS`: DAPO's dynamic
    sampling, Reinforce-Ada-Seq, SAGE's hints, DRO, alone or after a selector, e.g. ``insight+dapo``) also returns
    its curator, which
    :class:`CuratedGRPOTrainer` runs around TRL's generation. Anything else is refused here, before the model
    loads, naming the strategy and why."""
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Curator, Selector

    kwargs = dict(strategy_kwargs or {})
    if isinstance(strategy, Selector):
        return resolve_selector(strategy, **kwargs), None
    curator = build_curator(strategy, **kwargs) if isinstance(strategy, str) else strategy
    if not isinstance(curator, Curator):
        return resolve_selector(curator), None  # its own message
    if curator.selector.needs_trainer:  # e.g. dro_filter, alone or as dro_filter+dro
        raise ValueError(f"strategy {curator.name!r} cannot run in TRL's GRPOTrainer: its selector "
                         f"{curator.selector.name!r} needs this package's trainer ({curator.selector.needs_trainer}), "
                         f"while TRL's sampler draws a step's prompts ahead of the step (the dataloader's look-ahead) "
                         f"and generates nothing")
    foreign = foreign_parts(curator, _hosted_classes())
    if foreign is None:
        return resolve_selector(curator), None
    if foreign:
        raise ValueError(f"strategy {curator.name!r} cannot run in TRL's GRPOTrainer: {', '.join(foreign)} needs "
                         f"this package's trainer (per-prompt rollout counts or gradient norms, which TRL's "
                         f"fixed-size batches do not carry yet). In TRL: the prompt-level "
                         f"strategies ({', '.join(PROMPT_LEVEL_STRATEGIES)}), DAPO's dynamic sampling, "
                         f"Reinforce-Ada-Seq, SAGE's hints (with the task's own hints) and DRO's R3 reward and token "
                         f"weights, alone or after a prompt-level one (e.g. 'insight+dapo', 'insight+dro').")
    return resolve_selector(curator.selector), curator


def _hosted_classes():
    from rlcurate.curation.ada_seq import AdaSeqDownsample, AdaSeqSampler
    from rlcurate.curation.dapo import DapoFilter, DapoSampler
    from rlcurate.curation.dro import DROProcessor
    from rlcurate.curation.sage import SageLightSampler, SageSampler

    return (DapoSampler, AdaSeqSampler, SageSampler, SageLightSampler, DapoFilter, AdaSeqDownsample, DROProcessor)


def _dro_of(curator):
    """The curator's DRO processor (chapter 8), or None."""
    from rlcurate.curation.dro import DROProcessor

    return next((p for p in (curator.processors if curator is not None else []) if isinstance(p, DROProcessor)), None)


#: TRL's ``loss_type`` that aggregates as this package's ``loss_agg`` does (:mod:`rlcurate.train.loss`); the others
#: normalise differently (``bnpo``: per micro-batch) or are other surrogates, and are refused with DRO's token weights.
LOSS_TYPE_OF = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


class _Rounds:
    """The step context a hosted strategy's sampler runs in (``generate``, ``more_prompts``, and for SAGE ``task``,
    ``problems``, ``tokenizer``, ``render``): every ``generate`` is one of TRL's own generate-and-score calls on this
    process's share of the rows, the same on every rank.

    The step's prompts are the dataloader's chunk (its rows' index column, gathered); nothing is generated before
    the strategy asks, so a prompt SAGE-LIGHT hints is generated hinted only. A call's rows are whole groups of
    ``num_generations``, padded with groups of its first prompt until they split evenly over the processes (the
    padding is generated but neither observed nor trained on). A hinted prompt is the task's rendering with the
    hint (``render``), replacing the row's ``prompt``; TRL then trains on it, as SAGE does."""

    def __init__(self, trainer, inputs):
        from accelerate.utils import gather_object

        self.t, self.n = trainer, trainer.num_generations
        self.calls: list[tuple[dict, torch.Tensor]] = []  # (TRL's output for this process's rows, global rewards)
        self.tokens: list[list[tuple[list[int], list[int]]] | None] = []  # per call, (prompt, completion) ids per row
        every = gather_object([int(x[trainer.index_column]) for x in inputs])
        self.first = [int(i) for i in every[::self.n]]
        self.problems = trainer.curation.problems
        self.task = trainer.task
        self.tokenizer = trainer.processing_class

    def chunk_prompts(self) -> list[int]:
        return list(self.first)

    def context(self, step: int, prompts_per_step: int):
        from types import SimpleNamespace

        return SimpleNamespace(step=step, prompts_per_step=prompts_per_step, group_size=self.n,
                               generate=self.generate, more_prompts=self.t.curation.more, task=self.task,
                               problems=self.problems, tokenizer=self.tokenizer, render=self.render,
                               sequence_logprobs=self.sequence_logprobs)

    def sequence_logprobs(self, contexts, continuations, token_budget: int | None = None) -> list[np.ndarray]:
        """log pi(y_j | context, y_<j) under TRL's current model, by this package's own scoring
        (:func:`rlcurate.policy.scoring.sequence_logprobs`: no gradient, eval mode, temperature 1): DRO's
        teacher-forced reference answers (chapter 8). Each process scores its share of the pairs and all of them
        are gathered, so every rank holds the same numbers and takes the same decisions."""
        from accelerate.utils import gather_object

        from rlcurate.policy.scoring import sequence_logprobs

        t = self.t
        P, rank = t.accelerator.num_processes, t.accelerator.process_index
        bounds = [len(contexts) * k // P for k in range(P + 1)]
        lo, hi = bounds[rank], bounds[rank + 1]
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        model = t.accelerator.unwrap_model(t.model)
        mine = (sequence_logprobs(model, contexts[lo:hi], continuations[lo:hi], pad, token_budget or 16384)
                if hi > lo else [])
        if P == 1:
            return mine
        return [np.asarray(x, dtype=float) for x in gather_object([x.tolist() for x in mine])]

    def render(self, index: int, hint: str | None = None, hint_mode: str | None = None) -> str:
        problem = self.problems[index]
        if hint_mode is None:
            return self.task.render(problem, self.tokenizer, hint=hint)
        return self.task.render(problem, self.tokenizer, hint=hint, hint_mode=hint_mode)

    def _call(self, rows: list[dict], levels: list[int], padding: int) -> int:
        """One of TRL's generate-and-score calls on this process's ``rows``; ``levels`` holds each global row's
        hint level, and the last ``padding`` global rows are not evidence. Returns the call's number."""
        t = self.t
        t._row_levels, t._padding = levels, padding
        try:
            out = super(CuratedGRPOTrainer, t)._generate_and_score_completions(rows)
        finally:
            t._row_levels, t._padding = None, 0
        unknown = [k for k, v in out.items() if v is not None and k not in _TEXT_ONLY]
        if unknown:
            raise NotImplementedError(f"strategy {t.curator.name!r} in TRL handles text batches; this batch also "
                                      f"holds {unknown}")
        self.calls.append((out, t._scored[1]))
        self.tokens.append(self._row_tokens(out) if t._dro is not None else None)
        return len(self.calls) - 1

    def _row_tokens(self, out: dict) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, completion ids) of every global row of a call (gathered): the completion up to and with
        its EOS token (TRL's completion mask; a truncated row masked by ``mask_truncated_completions`` keeps its
        tokens up to the padding)."""
        from accelerate.utils import gather_object

        pad = self.t._tokenizer.pad_token_id
        rows = []
        for p, pm, c, cm in zip(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], out["completion_mask"]):
            ids = c[cm.bool()].tolist()
            if not ids:
                ids = c.tolist()
                while ids and ids[-1] == pad:
                    ids.pop()
            rows.append((p[pm.bool()].tolist(), ids))
        return gather_object(rows) if self.t.accelerator.num_processes > 1 else rows

    def _row(self, call: int, row: int) -> HostedRow:
        if self.tokens[call] is None:
            return HostedRow(call, row)
        prompt_ids, ids = self.tokens[call][row]
        eos = set(int(e) for e in self.t.eos_token_ids)
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] in eos else ids, skip_special_tokens=False)
        return HostedRow(call, row, tuple(ids), tuple(prompt_ids), text)

    def _generate_groups(self, prompts: list[int], texts: list[str | None], levels: list[int]) -> tuple[int, list[int]]:
        """Generate one group of each of ``prompts`` (``texts[k]``: its hinted prompt, None for the dataset's),
        padded to split evenly; returns the call and each group's first global row."""
        P, n = self.t.accelerator.num_processes, self.n
        pad = 0
        while (len(prompts) + pad) * n % P:
            pad += 1
        prompts, texts, levels = prompts + [prompts[0]] * pad, texts + [texts[0]] * pad, levels + [levels[0]] * pad
        rows = []
        for i, text in zip(prompts, texts):
            row = dict(self.t.train_dataset[int(i)])
            if text is not None:
                row["prompt"] = text
            rows += [row] * n
        share = len(rows) // P
        rank = self.t.accelerator.process_index
        call = self._call(rows[rank * share:(rank + 1) * share], [lv for lv in levels for _ in range(n)],
                          padding=pad * n)
        return call, [k * n for k in range(len(prompts) - pad)]

    def generate(self, indices, m, hints=None, hint_levels=None, hint_mode=None) -> list:
        """``m`` completions of each prompt (a multiple of num_generations), as this package's groups;
        ``hints[k]`` written into prompt k at level ``hint_levels[k]`` (SAGE, chapter 7)."""
        from rlcurate.curation.base import Group

        indices, n = [int(i) for i in indices], self.n
        if isinstance(m, (list, tuple)) or m % n:
            raise ValueError(f"TRL generates whole groups of {n}: a strategy asked for {m} completions per prompt")
        hints = list(hints) if hints is not None else [None] * len(indices)
        levels = list(hint_levels) if hint_levels is not None else [0] * len(indices)
        texts = [None if h is None else self.render(i, h, hint_mode) for i, h in zip(indices, hints)]
        order = [a for a in range(len(indices)) for _ in range(m // n)]  # a prompt's groups next to each other
        call, starts = self._generate_groups([indices[a] for a in order], [texts[a] for a in order],
                                             [levels[a] for a in order])
        refs: list[list[HostedRow]] = [[] for _ in indices]
        for a, start in zip(order, starts):
            refs[a] += [self._row(call, start + j) for j in range(n)]
        groups = []
        for a, i in enumerate(indices):
            r = np.array([float(self.calls[x.call][1][x.row]) for x in refs[a]])
            keep = ~np.isnan(r)  # unscorable completions are not part of the pool
            rows = [x for x, k in zip(refs[a], keep) if k]
            groups.append(Group(index=i, problem=self.problems[i], prompt=texts[a] or "", completions=rows,
                                rewards=r[keep], generated=len(refs[a]), hint_level=int(levels[a])))
        return groups

    def spare(self) -> HostedRow:
        """A row to stand in where a group is short (its completion mask is zeroed)."""
        return HostedRow(0, 0)

    def deal(self, slots: list[tuple[HostedRow, float, bool, np.ndarray | None]]) -> dict:
        """The training batch: ``slots`` in order, ``len(inputs)`` per process. Each process sends the slots whose
        rows it generated (with the advantage set and, where masked, the completion mask zeroed), every process
        takes its own share, prompts left-padded and completions right-padded to the widest.

        A slot's fourth entry holds per-token loss weights (DRO's, chapter 8); when any slot has them, every row's
        advantage is a row of the completion's width, A * w_t at token t (1 past the weights: the padding, which
        the mask drops), and TRL's loss takes advantages of shape (B, T) as they are: for w_t >= 0 its
        -min(rho_t A w_t, clip(rho_t) A w_t) is w_t times its per-token loss, as this package's loss weights it
        (:func:`rlcurate.train.loss.policy_loss`), and the KL term stays unweighted there as here."""
        from accelerate.utils import gather_object

        t = self.t
        P, rank = t.accelerator.num_processes, t.accelerator.process_index
        per_token = any(slot[3] is not None for slot in slots)
        mine = []
        for pos, (ref, adv, masked, tw) in enumerate(slots):
            out, rewards = self.calls[ref.call]
            local = rewards.numel() // P
            if ref.row // local != rank:
                continue
            row = {key: v[ref.row % local].detach().cpu() for key, v in out.items()
                   if isinstance(v, torch.Tensor) and v.ndim > 0}
            dtype = row["advantages"].dtype
            if per_token:
                w = np.ones(row["completion_ids"].shape[0])
                if tw is not None:
                    w[:len(tw)] = np.asarray(tw, dtype=float)[:w.size]
                row["advantages"] = torch.tensor(adv * w, dtype=dtype)
            else:
                row["advantages"] = torch.tensor(adv, dtype=dtype)
            if masked:
                for key in ("completion_mask", "tool_mask"):
                    if key in row:
                        row[key] = torch.zeros_like(row[key])
            mine.append((pos, row))
        everything = sorted((item for part in gather_object([mine]) for item in part), key=lambda x: x[0])
        share = len(everything) // P
        rows = [row for _, row in everything[rank * share:(rank + 1) * share]]
        device = t.accelerator.device
        batch = {}
        for key in rows[0]:
            parts = [row[key] for row in rows]
            if parts[0].ndim == 0:
                batch[key] = torch.stack(parts).to(device)
                continue
            width = max(x.shape[0] for x in parts)
            pad = t._tokenizer.pad_token_id if key in ("prompt_ids", "completion_ids") else 0
            sides = (lambda w: (w, 0)) if key in _PROMPT_SIDE else (lambda w: (0, w))
            batch[key] = torch.stack([torch.nn.functional.pad(x, sides(width - x.shape[0]), value=pad)
                                      for x in parts]).to(device)
        tokens = sum(float((row["completion_mask"] * row.get("tool_mask", 1)).sum()) for _, row in everything)
        batch["num_items_in_batch"] = torch.tensor(tokens, device=device)
        return batch


class CurationSampler(Sampler[int]):
    """TRL's ``RepeatSampler`` contract with prompts chosen by an rlcurate strategy.

    Args:
        selection: the :class:`~rlcurate.interop._core.PromptSelection` that chooses the prompts.
        mini_repeat_count: ``num_generations``: each index is yielded this many times in a row.
        batch_size: distinct prompts per chunk (``generation_batch_size // num_generations``).
        repeat_count: ``num_iterations * steps_per_generation``: each chunk is yielded this many times.
        chunks_per_epoch: chunks per pass of the dataloader (default: pool size // batch_size, the number
            of full chunks ``RepeatSampler`` yields), which sets ``len()``.
    """

    def __init__(self, selection: PromptSelection, mini_repeat_count: int, batch_size: int = 1,
                 repeat_count: int = 1, chunks_per_epoch: int | None = None):
        for name, v in (("mini_repeat_count", mini_repeat_count), ("batch_size", batch_size),
                        ("repeat_count", repeat_count)):
            if isinstance(v, bool) or int(v) < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.selection = selection
        self.mini_repeat_count = int(mini_repeat_count)
        self.batch_size = int(batch_size)
        self.repeat_count = int(repeat_count)
        n = selection.n_items // self.batch_size if chunks_per_epoch is None else int(chunks_per_epoch)
        if n < 1:
            raise ValueError(f"the pool of {selection.n_items} prompts holds no full chunk of {self.batch_size}")
        self.chunks_per_epoch = n
        self.pending: list[dict] = []  # chunks chosen before a checkpoint but not yet trained: yielded first
        self.skip = 0  # passes a resumed loop skips (trained before the checkpoint), or a function counting them

    def __iter__(self):
        skip, self.skip = self.skip, 0
        skip = skip() if callable(skip) else int(skip)
        for _ in range(skip):  # the Hugging Face loop discards them unseen: nothing is selected for them
            yield from [0] * (self.batch_size * self.mini_repeat_count)
        for _ in range(self.chunks_per_epoch - skip // self.repeat_count):
            passes = self.repeat_count
            if self.pending:  # a resumed run trains what the interrupted one had chosen ahead, as it would have
                entry = self.pending.pop(0)
                chunk = [int(i) for i in entry["indices"]]
                passes = int(entry.get("passes", passes))  # fewer: the chunk in flight when the checkpoint was saved
                round_ = int(entry["round"])  # what it had observed when chosen (older checkpoints: at most round)
                observed = int(entry.get("observed", min(self.selection.observed, round_)))
                self.selection.history.append({"round": round_, "observed": observed, "indices": chunk})
            else:
                chunk = self.selection.select(self.batch_size)  # chosen only when the first index is needed
            for _ in range(passes):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        return self.chunks_per_epoch * self.batch_size * self.mini_repeat_count * self.repeat_count

    def state_dict(self) -> dict[str, Any]:
        return self.selection.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.selection.load_state_dict(state)


def _with_columns(dataset, index_column: str):
    """``dataset`` with ``index_column`` = row position (a ``datasets.Dataset``), added when missing."""
    names = getattr(dataset, "column_names", None)
    if names is None:
        raise ValueError("CuratedGRPOTrainer needs a map-style datasets.Dataset (an iterable dataset cannot "
                         "be indexed by a sampler)")
    if index_column in names:
        col = dataset[index_column]
        if list(col) != list(range(len(dataset))):
            raise ValueError(f"column {index_column!r} must hold the row positions 0..{len(dataset) - 1}")
        return dataset
    return dataset.add_column(index_column, list(range(len(dataset))))


try:
    from trl import GRPOTrainer
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("rlcurate.interop.trl needs TRL: pip install 'rlcurate[trl]'") from exc


class CuratedGRPOTrainer(ZeroAdvantageSkipping, GRPOTrainer):
    """``trl.GRPOTrainer`` with prompts chosen by an rlcurate strategy and rewards fed back to it.

    All arguments of ``GRPOTrainer`` plus:

    Args:
        strategy: a prompt-level strategy name (``insight``, ``mopps``, ``expected_difficulty``,
            ``inverse_evidence``, ``prefilter``, ``uniform``), DAPO's dynamic sampling alone or after one of them
            (``dapo``, ``insight+dapo``), Ada-Seq, SAGE, DRO (``dro``, ``insight+dro``), a ``Selector`` or a
            ``Curator`` (see :func:`hosted_parts`).
        strategy_kwargs: its keyword arguments (with a name).
        index_column: dataset column holding each row's position (added when missing; reward
            functions receive it as a keyword argument like any other column).
        uid_column: dataset column of stable ids (the prefilter's audit file is matched against it);
            positions when the column is absent.
        skip_zero_advantage: train each micro-batch without its zero-advantage rows, the update unchanged
            (:mod:`rlcurate.interop.trl_skip`; the strategy still observes every row).

    ``self.curation`` is the :class:`~rlcurate.interop._core.PromptSelection`; ``self.curation_log``
    lists, per observed generation batch, ``{prompt: (successes, trials)}``; with DAPO, ``self.dapo_log`` lists per
    step the prompt of every generated group, which were mixed, and the positions kept (and filled at the cap).
    """

    def __init__(self, *args, strategy="insight", strategy_kwargs: dict | None = None,
                 index_column: str = "rlcurate_index", uid_column: str = "uid", task=None,
                 skip_zero_advantage: bool = False, **kwargs):
        if args:
            raise TypeError("pass GRPOTrainer's arguments by keyword (model=..., reward_funcs=..., ...)")
        train_dataset = kwargs.get("train_dataset")
        if train_dataset is None:
            raise ValueError("CuratedGRPOTrainer needs a train_dataset")
        kwargs["train_dataset"] = _with_columns(train_dataset, index_column)
        self.index_column = index_column
        selector, self.curator = hosted_parts(strategy, strategy_kwargs)  # refused before the model loads
        if kwargs.get("args") is not None:
            _refuse_workers(kwargs["args"])
        self._dro = _dro_of(self.curator)
        self.task = task
        if self.curator is not None:
            from trl import GRPOConfig

            self._check_hosted(kwargs.get("args") or GRPOConfig(output_dir="."), train_dataset, uid_column)
        self._uid_column = uid_column
        self.curation: PromptSelection | None = None
        self.curation_log: list[dict[int, tuple[int, int]]] = []
        self._curation_sampler: CurationSampler | None = None
        uids = train_dataset[uid_column] if uid_column in getattr(train_dataset, "column_names", ()) else None
        problems = None
        if task is not None and uids is not None:  # a uid the task lacks is refused before the model loads
            problems = problems_by_uid(task, uids, f"the training dataset's column {uid_column!r}")
        super().__init__(skip_zero_advantage=skip_zero_advantage, **kwargs)
        _refuse_workers(self.args)
        ds = self.train_dataset
        if len(ds) != len(train_dataset):
            raise RuntimeError(f"TRL's GRPOTrainer changed the training set's size ({len(train_dataset)} -> {len(ds)})")
        self.curation = PromptSelection(selector, len(ds), group_size=self.num_generations, seed=self.args.seed,
                                        uids=uids, problems=problems)
        self._scored: tuple[list[int], torch.Tensor] | None = None  # the latest generation's (indices, rewards)
        self._row_levels: list[int] | None = None  # the hint level of each global row of the running generation
        self._padding = 0  # its last rows only pad it (not evidence)
        self._rng_checkpoint: str | None = None  # restore the generators from it after the first fetch (resume)
        self._step_evidence: list | None = None  # during a hosted step: each call's (indices, rewards, levels)
        self.step_log: list[dict] = []  # per step of a response-level strategy: what was generated and kept


    # ------------------------------------------------------------------ the sampler
    def _get_train_sampler(self, dataset=None) -> Sampler:
        if dataset is not None and dataset is not self.train_dataset:
            return super()._get_train_sampler(dataset)
        if self._curation_sampler is None:
            gen_bs = self.args.generation_batch_size
            if gen_bs % self.num_generations:
                raise ValueError(f"generation_batch_size {gen_bs} is not a multiple of num_generations "
                                 f"{self.num_generations}")
            self._curation_sampler = CurationSampler(
                self.curation, mini_repeat_count=self.num_generations, batch_size=gen_bs // self.num_generations,
                repeat_count=self.num_iterations * self.args.steps_per_generation)
        return self._curation_sampler

    # ------------------------------------------------------------------ the feedback
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:  # not during evaluation
            from accelerate.utils import gather_object

            local = [int(x[self.index_column]) for x in inputs]
            indices = gather_object(local)  # same rank order as TRL's gather of the rewards
            w = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
            rewards = (rewards_per_func * w).nansum(dim=1)
            rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable: not evidence
            self._scored = (indices, rewards.detach().cpu())
            evidence = rewards.detach().cpu().numpy().copy()
            if self._padding:
                evidence[len(evidence) - self._padding:] = np.nan
            if self._step_evidence is not None:  # a hosted strategy's call: observed once, when its step ends
                self._step_evidence.append((indices, evidence, self._row_levels))
            else:
                self._observe(indices, evidence, self._row_levels)
        return rewards_per_func

    def _observe(self, indices, evidence, levels, trained=None) -> None:
        counts = self.curation.observe(indices, evidence, levels, trained=trained)
        self.curation_log.append(counts)
        for k, v in self.curation.metrics().items():
            self._metrics["train"][f"curation/{k}"].append(v)

    # ------------------------------------------------------------------ response-level strategies
    def _check_hosted(self, args, dataset, uid_column: str) -> None:
        """Before the model loads: the GRPOConfig options and inputs a hosted strategy cannot work with."""
        sampler = self.curator.sampler
        if hasattr(sampler, "hints"):  # SAGE and SAGE-LIGHT write hints into prompts the task renders
            name = self.curator.name
            if self.task is None:
                raise ValueError(f"strategy {name!r} in TRL needs task= (an rlcurate task: its hints and its "
                                 f"render(problem, tokenizer, hint=...) write the hinted prompts)")
            check_task_hints(sampler.hints, self.task, f"strategy {name!r} in TRL", chat_turns=False)
            if uid_column not in getattr(dataset, "column_names", ()) or not isinstance(dataset[0]["prompt"], str):
                raise ValueError(f"strategy {name!r} in TRL needs a dataset of text prompts rendered by the task "
                                 f"(task.render) with the problems' uids in column {uid_column!r}")
        dro = self._dro
        if dro is not None:  # DRO teacher-forces each problem's reference answer after each completion's reasoning
            name = self.curator.name
            if self.task is None or uid_column not in getattr(dataset, "column_names", ()):
                raise ValueError(f"strategy {name!r} in TRL needs task= (an rlcurate task: the reference answer as it "
                                 f"writes it, its answer delimiter) and the problems' uids in column {uid_column!r}")
            loss, level = args.loss_type, args.importance_sampling_level
            if dro.use_as in ("token_weights", "both") and (loss not in LOSS_TYPE_OF.values() or level != "token"):
                raise ValueError(f"strategy {name!r} in TRL weights TRL's per-token loss as this package's loss does "
                                 f"only for loss_type 'dapo' (token-mean), 'grpo' (seq-mean-token-mean) or 'dr_grpo' "
                                 f"(seq-mean-token-sum-norm) with importance_sampling_level 'token'; got "
                                 f"loss_type={loss!r}, importance_sampling_level={level!r}")
        scale, aggregation = args.scale_rewards, args.multi_objective_aggregation
        if scale not in ("group", "none") or aggregation != "sum_then_normalize":
            raise ValueError(f"strategy {self.curator.name!r} in TRL needs advantages computed within each group "
                             f"(scale_rewards 'group' or 'none', multi_objective_aggregation 'sum_then_normalize'); "
                             f"got scale_rewards={scale!r}, multi_objective_aggregation={aggregation!r}")
        n = args.num_generations
        m = getattr(self.curator.sampler, "round_repeat", n)
        if m % n:
            raise ValueError(f"strategy {self.curator.name!r} in TRL: round_repeat {m} is not a multiple of "
                             f"num_generations {n} (TRL generates whole groups)")

    def _generate_and_score_completions(self, inputs):
        if self.curator is None or not self.model.training:
            return super()._generate_and_score_completions(inputs)
        from rlcurate.curation.base import group_advantages

        host = _Rounds(self, inputs)
        chunk = host.chunk_prompts()
        B = len(chunk)
        ctx = host.context(step=self.state.global_step, prompts_per_step=B)
        # the selector learns once per step from every call's rows, as in this package's step (its discount applied
        # once; its evidence="trained" reads the kept groups), and its top-ups (more_prompts) leave the chunk out
        self.curation.selector.take(chunk)
        self._step_evidence = []
        try:
            groups = self.curator.sampler.rollout(ctx, chunk)
            kept = self.curator.process(ctx, groups)
        finally:
            calls, self._step_evidence = self._step_evidence, None
        for part in [self.curator.sampler, *self.curator.processors]:  # SAGE-LIGHT's levels, as this package's step
            part.observe(ctx, kept)
        if calls:
            self._observe(*(np.concatenate([np.asarray(c[j]) for c in calls]) for j in range(3)), trained=kept[:B])
        kind = "grpo" if self.scale_rewards == "group" else "drgrpo"
        per_token = self._dro is not None and self._dro.use_as in ("token_weights", "both")
        slots = []  # (row, advantage, masked, per-token weights or None), in training order
        for g in kept[:B]:
            adv = group_advantages(g, kind, eps=1e-4)
            if per_token:  # the rows hold their tokens: DRO's weights (times any sampler's) per token
                tws = [None if g.token_weights is None else np.asarray(g.token_weights[j], dtype=float)
                       for j in range(g.size)]
                slots += [(row, float(a), False, tw) for row, a, tw in zip(g.completions, adv, tws)]
            else:  # one placeholder token per row: a processor's weight is per completion (Ada-Seq's class weights)
                scale = [1.0 if g.token_weights is None
                         else float(np.mean(g.token_weights[j]) if len(g.token_weights[j]) else 0.0)
                         for j in range(g.size)]
                slots += [(row, float(a) * f, False, None) for row, a, f in zip(g.completions, adv, scale)]
            short = self.num_generations - g.size
            slots += [(g.completions[0] if g.completions else host.spare(), 0.0, True, None)] * short
        filled = B - min(len(kept), B)
        slots += [(host.spare(), 0.0, True, None)] * (filled * self.num_generations)
        self.step_log.append({"generated": [(g.index, g.size) for g in groups], "kept": [g.index for g in kept[:B]],
                              "hint_levels": [g.hint_level for g in kept[:B]], "filled_groups": filled,
                              "calls": len(host.calls)})
        parts = {k: v for part in [self.curator.sampler, *self.curator.processors] for k, v in part.metrics().items()}
        for k, v in {**parts, "generation_calls": len(host.calls), "filled_groups": filled}.items():
            self._metrics["train"][f"curation/{k}"].append(float(v))
        return host.deal(slots)

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        done = self._step % self._generate_every  # micro-steps of the running generation batch already trained
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save and os.path.isdir(folder):
            # the chunks the dataloader's look-ahead chose but training has not reached (each generation batch is
            # observed once, so chunk r is trained once r < observed)
            pending = [{"round": h["round"], "observed": h["observed"], "indices": h["indices"]}
                       for h in self.curation.history if h["round"] >= self.curation.observed]
            if done:  # saved within a generation batch (num_iterations > 1 or steps_per_generation > A): its last
                # passes are trained on resume from the completions TRL generated (rlcurate_generation_<rank>.pt)
                in_flight = next(h for h in self.curation.history if h["round"] == self.curation.observed - 1)
                pending.insert(0, {"round": in_flight["round"], "observed": in_flight["observed"],
                                   "indices": in_flight["indices"], "passes": self._generate_every - done})
            with open(os.path.join(folder, SAMPLER_STATE_FILE), "w") as f:
                json.dump({**self.curation.state_dict(), "pending": pending}, f)
            if self.curator is not None:  # the hosted sampler's and processors' state (SAGE-LIGHT's levels)
                with open(os.path.join(folder, CURATOR_STATE_FILE), "w") as f:
                    json.dump(self.curator.rollout_state_dict(), f)

        path = os.path.join(folder, GENERATION_STATE_FILE.format(rank=self.accelerator.process_index))
        if done and os.path.isdir(folder):
            torch.save({"step": self._step, "buffer": self._buffered_inputs}, path)
        elif os.path.isfile(path):  # an earlier run's, saved into the same folder: resuming would train its buffer
            os.remove(path)

    @property
    def _generate_every(self) -> int:
        """The micro-steps one generation batch is trained on (TRL's ``generate_every``)."""
        return self.args.steps_per_generation * self.num_iterations

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if not checkpoint:
            return
        path = os.path.join(checkpoint, SAMPLER_STATE_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                state = json.load(f)
            self.curation.load_state_dict(state)
            if self._curation_sampler is not None:
                self._curation_sampler.pending = list(state.get("pending", []))
        path = os.path.join(checkpoint, CURATOR_STATE_FILE)
        if self.curator is not None and os.path.isfile(path):
            with open(path) as f:
                self.curator.load_rollout_state_dict(json.load(f))
        path = os.path.join(checkpoint, GENERATION_STATE_FILE.format(rank=self.accelerator.process_index))
        if os.path.isfile(path):  # resumed within a generation batch: TRL trains the rest of its buffer
            state = torch.load(path, map_location=self.accelerator.device, weights_only=False)
            self._step, self._buffered_inputs = int(state["step"]), state["buffer"]
        if self._curation_sampler is not None and not self.args.ignore_data_skip:
            # counted when the loop starts to iterate: transformers 5.0 loads the trainer state after this call
            self._curation_sampler.skip = self._batches_the_loop_skips
        self._rng_checkpoint = checkpoint if self.args.ignore_data_skip else None

    def _batches_the_loop_skips(self) -> int:
        """The batches of the resumed epoch the Hugging Face loop skips, by its own rule: (global_step mod
        updates per epoch) x gradient_accumulation_steps."""
        sampler, A = self._curation_sampler, self.args.gradient_accumulation_steps
        updates_per_epoch = max(-(-sampler.chunks_per_epoch * sampler.repeat_count // A), 1)
        return self.state.global_step % updates_per_epoch * A

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._rng_checkpoint:
            # with ignore_data_skip the loop restores the generators before it builds the dataloader's iterator, which
            # draws its base seed from them: within an epoch restored again here, as the loop does itself after
            # skipping batches; at an epoch's start the uninterrupted run draws that seed there too, so not
            if self._batches_the_loop_skips():
                self._load_rng_state(self._rng_checkpoint)
            self._rng_checkpoint = None
        return batches


def _refuse_workers(args) -> None:
    if int(getattr(args, "dataloader_num_workers", 0) or 0) != 0:
        raise ValueError(f"dataloader_num_workers={args.dataloader_num_workers}: worker processes would choose prompts "
                         f"several generation batches before their rewards arrive; set dataloader_num_workers=0")


def selection_lag(history: Sequence[dict]) -> list[int]:
    """For each selection after the first, how many generation batches it lagged: round r saw the
    rewards of ``history[r]['observed']`` batches, so it lags ``r - observed`` (0: it saw every earlier
    batch). For tests and the appendix."""
    return [int(h["round"] - h["observed"]) for h in history[1:]]

