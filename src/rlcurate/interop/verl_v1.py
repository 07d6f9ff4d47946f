"""rlcurate's prompt selection in verl's v1 trainer, verl 0.8 and later (appendix A2, *Scaling out with verl*).

verl 0.8 removed the curriculum-sampler hook that :mod:`rlcurate.interop.verl` plugs into
(``data.sampler.class_path``). Its documented extension point is now a registered trainer: a subclass of
``verl.trainer.ppo.v1.PPOTrainer`` decorated with ``register_trainer(name)`` and selected by
``trainer.v1.trainer_mode=name`` (``main_ppo``'s ``TaskRunnerV1`` calls ``get_trainer_cls`` on it). This
module registers :class:`CuratedPPOTrainer` as ``rlcurate_curated``, a subclass of verl's synchronous
trainer (``PPOTrainerSync``, the default mode ``sync``) that changes two things:

* ``_init_dataloader``: verl builds its ``StatefulDataLoader`` as usual; the trainer then builds it again
  with the same dataset, batch size, workers, ``drop_last`` and ``collate_fn``, and with
  :class:`~rlcurate.interop.verl.CurationSampler` as its sampler, configured from the keys the 0.7 adapter
  reads: ``data.sampler.strategy``, ``strategy_kwargs``, ``group_size``, ``uid_key``, ``seed``. verl saves
  ``train_dataloader.state_dict()`` in ``data.pt`` with every checkpoint, so the sampler's state travels
  with it as on verl 0.7. A selection holds ``data.train_batch_size`` prompts even where verl fetches one
  prompt at a time (``data.gen_batch_size=1``, which verl forces under DAPO's ``algorithm.filter_groups``).
* ``_step_once``: after verl's step (rollout, reward, advantage, update) the trainer reads each trained
  response's ``index`` (the dataset's ``extra_info["index"]``, which the agent loop stores with every
  trajectory) and ``rm_scores`` (its reward on the response tokens, before any KL penalty) from
  TransferQueue with ``tq.kv_batch_get`` and passes them to :meth:`CurationSampler.observe`, the grouping
  code of the 0.7 adapter's ``update``. Padding rows (``is_padding`` tags, added to even out data-parallel
  shards) are skipped, and of a multi-turn session only its last output counts, as verl's own GRPO does.

In sync mode the next step's prompts are drawn from the dataloader at the start of the next ``step`` (its
``prepare_step``), after this observation: selection does not lag.

Not hosted: with ``algorithm.filter_groups`` on, verl's replay buffer clears the groups it filters from
TransferQueue before the step, so the sampler observes only the groups trained on (rlcurate's own
``insight+dapo`` observes every generated group). ``algorithm.adv_estimator=rlcurate_pool_grpo`` is refused
when the trainer is built: verl 0.9.1's ``_compute_advantage`` reads a fixed list of fields from
TransferQueue, without ``reward_baselines``, and nothing in verl 0.9 writes them (appendix A2).

Selecting the trainer::

    VERL_USE_EXTERNAL_MODULES=rlcurate.interop.verl_v1 python3 -m verl.trainer.main_ppo \\
        trainer.v1.trainer_mode=rlcurate_curated data.dataloader_num_workers=0 \\
        +data.sampler.strategy=insight '+data.sampler.strategy_kwargs={mu: 0.3}' +data.sampler.group_size=8 ...

``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import this module in every process, the Ray actor
that runs the trainer included, so the name is registered where ``get_trainer_cls`` looks it up.
Tested with verl 0.9.1 (``tests/test_interop_verl_current.py``).
"""

from __future__ import annotations

try:
    import transfer_queue as tq
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.v1.trainer_base import register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
except ImportError as exc:
    raise ImportError(
        "rlcurate.interop.verl_v1 needs verl >= 0.8 with its v1 trainer (verl.trainer.ppo.v1) and TransferQueue; "
        "tested with verl 0.9.1. With verl 0.5 to 0.7.1 use rlcurate.interop.verl, the curriculum sampler "
        f"(appendix A2). Import failed: {exc}") from exc

from rlcurate.interop.verl import POOL_ADV_ESTIMATOR, CurationSampler

__all__ = ["CuratedPPOTrainer", "TRAINER_NAME", "curated_dataloader", "trained_responses", "observe_step"]

TRAINER_NAME = "rlcurate_curated"


def curated_dataloader(loader: StatefulDataLoader, data_config) -> StatefulDataLoader:
    """verl's training dataloader rebuilt with a :class:`CurationSampler` (same dataset, batch size,
    workers, ``drop_last`` and ``collate_fn``); one selection is ``data.train_batch_size`` prompts."""
    sampler = CurationSampler(loader.dataset, data_config, batch_size=int(data_config.train_batch_size))
    return StatefulDataLoader(dataset=loader.dataset, batch_size=loader.batch_size, num_workers=loader.num_workers,
                              drop_last=loader.drop_last, collate_fn=loader.collate_fn, sampler=sampler)


def trained_responses(keys, tags) -> list[int]:
    """Positions of the rows that are one response each: not padding, and the last output of each
    session (keys are ``{uid}_{session_id}_{output_index}``, as verl's agent loop writes them)."""
    last: dict[str, tuple[int, int]] = {}
    for row, (key, tag) in enumerate(zip(keys, tags)):
        if tag.get("is_padding", False):
            continue
        uid, session, output = key.rsplit("_", 2)
        if f"{uid}_{session}" not in last or last[f"{uid}_{session}"][0] < int(output):
            last[f"{uid}_{session}"] = (int(output), row)
    return sorted(row for _, row in last.values())


def observe_step(sampler: CurationSampler, batch) -> dict[int, tuple[int, int]]:
    """Feed one trained ``KVBatchMeta`` to the sampler: each response's ``index`` and summed ``rm_scores``
    from TransferQueue. Returns ``{prompt position: (successes, responses)}``."""
    rows = trained_responses(batch.keys, batch.tags)
    if not rows:
        return {}
    keys = [batch.keys[r] for r in rows]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["index", "rm_scores"])
    ids = [i.item() if hasattr(i, "item") else i for i in list(data["index"])]
    scores = [float(s.sum().item()) for s in list(data["rm_scores"])]  # as verl's replay buffer sums them
    return sampler.observe(ids, scores)


@register_trainer(TRAINER_NAME)
class CuratedPPOTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with an rlcurate prompt-selection strategy as its sampler."""

    def __init__(self, config):
        if config.algorithm.adv_estimator == POOL_ADV_ESTIMATOR:
            raise ValueError(f"{TRAINER_NAME} cannot run algorithm.adv_estimator={POOL_ADV_ESTIMATOR}: verl 0.9's "
                             "_compute_advantage never passes reward_baselines to an estimator (appendix A2)")
        super().__init__(config)

    def _init_dataloader(self):
        super()._init_dataloader()
        self.train_dataloader = curated_dataloader(self.train_dataloader, self.config.data)
        self.train_dataloader_it = None

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int):
        batch = super()._step_once(metrics, timing_raw, sample_batch_size)
        sampler = self.train_dataloader.sampler
        observe_step(sampler, batch)
        metrics.update({f"rlcurate/{k}": v for k, v in sampler.selection.metrics().items()})
        return batch
