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

from rlcurate.interop._core import PromptSelection

__all__ = ["CurationSampler", "CuratedGRPOTrainer", "SAMPLER_STATE_FILE", "selection_lag"]

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
            ``inverse_evidence``, ``prefilter``, ``uniform``), a ``Selector`` or a ``Curator``.
        strategy_kwargs: its keyword arguments (with a name).
        index_column: dataset column holding each row's position (added when missing; reward
            functions receive it as a keyword argument like any other column).
        uid_column: dataset column of stable ids (the prefilter's audit file is matched against it);
            positions when the column is absent.

    ``self.curation`` is the :class:`~rlcurate.interop._core.PromptSelection`; ``self.curation_log``
    lists, per observed generation batch, ``{prompt: (successes, trials)}``.
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
        self._strategy = (strategy, dict(strategy_kwargs or {}))
        self._uid_column = uid_column
        self.curation: PromptSelection | None = None
        self.curation_log: list[dict[int, tuple[int, int]]] = []
        self._curation_sampler: CurationSampler | None = None
        super().__init__(**kwargs)
        ds = self.train_dataset
        uids = ds[uid_column] if uid_column in ds.column_names else None
        name, kw = self._strategy
        self.curation = PromptSelection(name, len(ds), group_size=self.num_generations, seed=self.args.seed,
                                        uids=uids, **kw)

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
            counts = self.curation.observe(indices, rewards.detach().cpu().numpy())
            self.curation_log.append(counts)
            for k, v in self.curation.metrics().items():
                self._metrics["train"][f"curation/{k}"].append(v)
        return rewards_per_func

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

