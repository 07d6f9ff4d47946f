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

**DAPO's dynamic sampling** (``strategy="dapo"``, or composed with a selector, ``"insight+dapo"``; chapter 6): TRL
has no hook for it (huggingface/trl#3708), so :class:`CuratedGRPOTrainer` overrides
``_generate_and_score_completions``. After TRL has generated and scored the sampler's generation batch of B prompts,
it generates further batches of ``gen_batch_size`` prompts chosen by the same selection while fewer than B groups are
mixed and fewer than ``max_num_gen_batches`` batches were generated (:meth:`DapoSampler.wants_more`), then keeps the
first B mixed groups in generation order (:func:`rlcurate.curation.dapo.first_mixed`), the rule of this package's DAPO.
Every round is TRL's own generation and scoring (so its reward functions, vLLM and metrics apply unchanged) and every
rank takes the same decisions from the rewards TRL gathers. The kept rows are then gathered from whichever process
generated them (``accelerate.utils.gather_object``) and dealt out again, ``len(inputs)`` rows per process, so a group
that spanned two processes arrives whole. Advantages are TRL's, computed within each group (``scale_rewards`` "group"
or "none"; "batch" would mix in the dropped groups and is refused). When the cap is reached with fewer than B mixed
groups, the batch is filled with unmixed groups whose completion mask is zeroed: they carry no token into the loss, as
this package trains on what it found.

The prefilter takes the audit's ``mixed.jsonl`` (``strategy_kwargs={"audit_file": ...}``) and matches
its uids against a dataset column (``uid_column``, default ``"uid"``; positions when absent).

Resuming from a TRL checkpoint: the sampler's state is saved as ``rlcurate_sampler.json`` in each
checkpoint folder and restored by ``train(resume_from_checkpoint=...)``; set ``ignore_data_skip=True``
in the config so that the Hugging Face loop does not replay (and thereby re-select) the batches it
already trained on.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import torch
from torch.utils.data import Sampler

from rlcurate.interop._core import PROMPT_LEVEL_STRATEGIES, PromptSelection, resolve_selector

__all__ = ["CurationSampler", "CuratedGRPOTrainer", "SAMPLER_STATE_FILE", "selection_lag", "hosted_parts"]

_PROMPT_SIDE = ("prompt_ids", "prompt_mask")  # left-padded; every other per-row tensor of width > 1 is right-padded
_TEXT_ONLY = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
              "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask",
              "num_items_in_batch")


def hosted_parts(strategy, strategy_kwargs: dict | None = None):
    """What of a strategy TRL's ``GRPOTrainer`` can host: ``(prompt selector, DapoSampler or None)``.

    A prompt-level strategy (:data:`PROMPT_LEVEL_STRATEGIES`) runs as the sampler; DAPO's dynamic sampling, alone or
    after a selector (``insight+dapo``), runs in :class:`CuratedGRPOTrainer`. Anything else is refused here, before
    the model loads, naming the strategy and why."""
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Curator, Selector
    from rlcurate.curation.dapo import DapoFilter, DapoSampler

    kwargs = dict(strategy_kwargs or {})
    if isinstance(strategy, Selector):
        return resolve_selector(strategy, **kwargs), None
    curator = build_curator(strategy, **kwargs) if isinstance(strategy, str) else strategy
    if isinstance(curator, Curator) and isinstance(curator.sampler, DapoSampler):
        extra = [p.name for p in curator.processors if not isinstance(p, DapoFilter)]
        if extra:
            raise ValueError(f"strategy {curator.name!r}: TRL hosts DAPO's dynamic sampling with a prompt selector, "
                             f"not the processors {', '.join(extra)}")
        return resolve_selector(curator.selector), curator.sampler
    try:
        return resolve_selector(curator), None
    except ValueError as exc:
        raise ValueError(f"{exc} In TRL: the prompt-level strategies ({', '.join(PROMPT_LEVEL_STRATEGIES)}) and DAPO's "
                         f"dynamic sampling, alone or after one of them (e.g. 'insight+dapo').") from None

SAMPLER_STATE_FILE = "rlcurate_sampler.json"


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

    def __iter__(self):
        for _ in range(self.chunks_per_epoch):
            chunk = self.selection.select(self.batch_size)  # chosen only when the first index is needed
            for _ in range(self.repeat_count):
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


class CuratedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with prompts chosen by an rlcurate strategy and rewards fed back to it.

    All arguments of ``GRPOTrainer`` plus:

    Args:
        strategy: a prompt-level strategy name (``insight``, ``mopps``, ``expected_difficulty``,
            ``inverse_evidence``, ``prefilter``, ``uniform``), DAPO's dynamic sampling alone or after one of them
            (``dapo``, ``insight+dapo``), a ``Selector`` or a ``Curator`` (see :func:`hosted_parts`).
        strategy_kwargs: its keyword arguments (with a name).
        index_column: dataset column holding each row's position (added when missing; reward
            functions receive it as a keyword argument like any other column).
        uid_column: dataset column of stable ids (the prefilter's audit file is matched against it);
            positions when the column is absent.

    ``self.curation`` is the :class:`~rlcurate.interop._core.PromptSelection`; ``self.curation_log``
    lists, per observed generation batch, ``{prompt: (successes, trials)}``; with DAPO, ``self.dapo_log`` lists per
    step the prompt of every generated group, which were mixed, and the positions kept (and filled at the cap).
    """

    def __init__(self, *args, strategy="insight", strategy_kwargs: dict | None = None,
                 index_column: str = "rlcurate_index", uid_column: str = "uid", **kwargs):
        if args:
            raise TypeError("pass GRPOTrainer's arguments by keyword (model=..., reward_funcs=..., ...)")
        train_dataset = kwargs.get("train_dataset")
        if train_dataset is None:
            raise ValueError("CuratedGRPOTrainer needs a train_dataset")
        kwargs["train_dataset"] = _with_columns(train_dataset, index_column)
        self.index_column = index_column
        selector, self.dapo = hosted_parts(strategy, strategy_kwargs)  # refused before the model loads
        self._uid_column = uid_column
        self.curation: PromptSelection | None = None
        self.curation_log: list[dict[int, tuple[int, int]]] = []
        self._curation_sampler: CurationSampler | None = None
        super().__init__(**kwargs)
        ds = self.train_dataset
        uids = ds[uid_column] if uid_column in ds.column_names else None
        self.curation = PromptSelection(selector, len(ds), group_size=self.num_generations, seed=self.args.seed,
                                        uids=uids)
        self._scored: tuple[list[int], torch.Tensor] | None = None  # the latest generation's (indices, rewards)
        self.dapo_log: list[dict] = []  # per DAPO step: every group's prompt and whether mixed, the kept positions
        if self.dapo is not None:
            self._check_dynamic_sampling()

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
            counts = self.curation.observe(indices, rewards.detach().cpu().numpy())
            self.curation_log.append(counts)
            for k, v in self.curation.metrics().items():
                self._metrics["train"][f"curation/{k}"].append(v)
        return rewards_per_func

    # ------------------------------------------------------------------ DAPO's dynamic sampling
    def _check_dynamic_sampling(self) -> None:
        n, P = self.num_generations, self.accelerator.num_processes
        wanted = self.args.generation_batch_size // n
        size = self.dapo.gen_batch_size or wanted
        if self.scale_rewards not in ("group", "none") or self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(f"DAPO's dynamic sampling in TRL needs advantages computed within each group "
                             f"(scale_rewards 'group' or 'none', multi_objective_aggregation 'sum_then_normalize'); "
                             f"got scale_rewards={self.scale_rewards!r}, which would mix in the groups it drops")
        for what, prompts in (("gen_batch_size", size), ("gen_batch_size - B", max(size - wanted, 0))):
            if prompts * n % P:
                raise ValueError(f"DAPO in TRL: {what} = {prompts} prompts x num_generations {n} rollouts do not "
                                 f"split evenly over {P} processes")

    def _rows_of(self, indices: list[int]) -> list[dict]:
        """This process's share of the rows of ``indices`` x num_generations (TRL's layout: a prompt's
        completions next to each other, the global batch cut into equal consecutive shares)."""
        rows = [self.train_dataset[int(i)] for i in indices for _ in range(self.num_generations)]
        share = len(rows) // self.accelerator.num_processes
        rank = self.accelerator.process_index
        return rows[rank * share:(rank + 1) * share]

    def _generate_and_score_completions(self, inputs):
        if self.dapo is None or not self.model.training:
            return super()._generate_and_score_completions(inputs)
        from accelerate.utils import gather_object

        from rlcurate.curation.dapo import first_mixed

        n = self.num_generations
        wanted = len(inputs) * self.accelerator.num_processes // n  # B: the groups of one generation batch
        size = self.dapo.gen_batch_size or wanted
        rounds = []  # (TRL's output for this process's rows, the global rewards of the round)
        prompts: list[int] = []  # the prompt of every generated group, in generation order

        def generate(rows):
            out = super(CuratedGRPOTrainer, self)._generate_and_score_completions(rows)
            unknown = [k for k, v in out.items() if v is not None and k not in _TEXT_ONLY]
            if unknown:
                raise NotImplementedError(f"DAPO in TRL handles text batches; this batch also holds {unknown}")
            rounds.append((out, self._scored[1]))
            prompts.extend(self._scored[0][::n])
            return self._scored[1]

        def mixed_groups(rewards):
            out = []
            for g in rewards.view(-1, n):
                g = g[~torch.isnan(g)]
                out.append(bool(g.numel() > 1 and (g != g[0]).any()))
            return out

        mixed = mixed_groups(generate(inputs))
        if size > wanted:  # the first batch topped up from the selection, as this package's DapoSampler does
            mixed += mixed_groups(generate(self._rows_of(self.curation.select(size - wanted))))
        batches = 1
        while self.dapo.wants_more(sum(mixed), batches, wanted):
            mixed += mixed_groups(generate(self._rows_of(self.curation.select(size))))
            batches += 1
        kept = first_mixed(mixed, wanted)
        filled = [g for g, m in enumerate(mixed) if not m][: wanted - len(kept)]  # only at the cap: masked below
        self.dapo.last_batches, self.dapo.last_mixed = batches, int(sum(mixed))
        self.dapo_log.append({"prompts": prompts, "mixed": mixed, "kept": kept, "filled": filled})
        for k, v in {"dapo_gen_batches": batches, "dapo_mixed": int(sum(mixed)),
                     "dapo_filled_groups": len(filled)}.items():
            self._metrics["train"][f"curation/{k}"].append(float(v))
        return self._deal(rounds, kept + filled, set(filled), gather_object)

    def _deal(self, rounds, groups: list[int], masked: set, gather_object) -> dict:
        """The rows of ``groups`` (positions in generation order over all rounds), ``len(inputs)`` per process in
        that order: each process sends the kept rows it generated, every process takes its own share."""
        n, P, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        where = {}  # global group position -> (round, first global row of the group)
        g0 = 0
        for r, (_, rewards) in enumerate(rounds):
            for j in range(rewards.numel() // n):
                where[g0 + j] = (r, j * n)
            g0 += rewards.numel() // n
        mine = []
        for slot, g in enumerate(groups):
            r, first = where[g]
            out, rewards = rounds[r]
            local = rewards.numel() // P
            for k in range(first, first + n):
                if k // local == rank:
                    row = {key: v[k % local].detach().cpu() for key, v in out.items()
                           if isinstance(v, torch.Tensor) and v.ndim > 0}
                    if g in masked:
                        for key in ("completion_mask", "tool_mask"):
                            if key in row:
                                row[key] = torch.zeros_like(row[key])
                    mine.append((slot * n + k - first, row))
        everything = sorted(((pos, row) for part in gather_object([mine]) for pos, row in part), key=lambda t: t[0])
        share = len(everything) // P
        rows = [row for _, row in everything[rank * share:(rank + 1) * share]]
        device = self.accelerator.device
        batch = {}
        for key in rows[0]:
            parts = [row[key] for row in rows]
            if parts[0].ndim == 0:
                batch[key] = torch.stack(parts).to(device)
                continue
            width = max(x.shape[0] for x in parts)
            pad = self._tokenizer.pad_token_id if key in ("prompt_ids", "completion_ids") else 0
            left = key in _PROMPT_SIDE
            batch[key] = torch.stack([torch.nn.functional.pad(x, (width - x.shape[0], 0) if left else
                                                              (0, width - x.shape[0]), value=pad) for x in parts]).to(device)
        mask = [row["completion_mask"] * row.get("tool_mask", 1) for _, row in everything]
        batch["num_items_in_batch"] = torch.tensor(float(sum(m.sum() for m in mask)), device=device)
        return batch

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save and os.path.isdir(folder):
            with open(os.path.join(folder, SAMPLER_STATE_FILE), "w") as f:
                json.dump(self.curation.state_dict(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, SAMPLER_STATE_FILE) if checkpoint else None
        if path and os.path.isfile(path):
            with open(path) as f:
                self.curation.load_state_dict(json.load(f))


def selection_lag(history: Sequence[dict]) -> list[int]:
    """For each selection after the first, how many generation batches it lagged: round r saw the
    rewards of ``history[r]['observed']`` batches, so it lags ``r - observed`` (0: it saw every earlier
    batch). For tests and the appendix."""
    return [int(h["round"] - h["observed"]) for h in history[1:]]

