"""rlcurate's prompt selection in verl's v1 trainer, verl 0.8 and later (appendix A2, *Scaling out with verl*).

verl 0.8 removed the curriculum-sampler hook that :mod:`rlcurate.interop.verl` plugs into
(``data.sampler.class_path``). Its documented extension point is now a registered trainer: a subclass of
``verl.trainer.ppo.v1.PPOTrainer`` decorated with ``register_trainer(name)`` and selected by
``trainer.v1.trainer_mode=name`` (``main_ppo``'s ``TaskRunnerV1`` calls ``get_trainer_cls`` on it). This
module registers :class:`CuratedPPOTrainer` as ``rlcurate_curated``, a subclass of verl's synchronous
trainer (``PPOTrainerSync``, the default mode ``sync``). verl 0.9.1 tests for the literal mode name ``"sync"``
in six places (which replay buffer, exact refills and one prompt per fetch, TransferQueue state on resume,
re-issued prompts), so the trainer sets ``trainer.v1.trainer_mode`` back to ``sync`` once verl has found it by
name, and runs as the sync trainer in every respect but these:

* ``_init_dataloader``: verl builds its ``StatefulDataLoader`` as usual; the trainer then builds it again
  with the same dataset, batch size, workers, ``drop_last`` and ``collate_fn``, and with
  :class:`~rlcurate.interop.verl.CurationSampler` as its sampler, configured from the keys the 0.7 adapter
  reads: ``data.sampler.strategy``, ``strategy_kwargs``, ``group_size``, ``uid_key``, ``seed``. verl saves
  ``train_dataloader.state_dict()`` in ``data.pt`` with every checkpoint, so the sampler's state travels
  with it as on verl 0.7. A selection holds ``data.train_batch_size`` prompts even where verl fetches one
  prompt at a time (``data.gen_batch_size=1``, which verl forces under DAPO's ``algorithm.filter_groups``).
* ``step``: after verl's step (rollout, reward, advantage, and its ``trainer.v1.sync.parameter_sync_step``
  updates, each a ``_step_once``) the trainer reads each trained response's ``index`` (the dataset's ``extra_info["index"]``, which the agent loop stores with every
  trajectory) and ``rm_scores`` (its reward on the response tokens, before any KL penalty) from
  TransferQueue with ``tq.kv_batch_get`` and passes them to :meth:`CurationSampler.observe`, the grouping
  code of the 0.7 adapter's ``update``. Padding rows (``is_padding`` tags, added to even out data-parallel
  shards) are skipped, and of a multi-turn session only its last output counts, as verl's own GRPO does.

* ``_balance_batch`` and ``_compute_advantage``, with ``+data.sampler.skip_zero_advantage=true``: the groups whose
  rewards are all the same (and verl's padding rows) leave the batch before verl balances and pads it, and the kept
  advantages are scaled so that the loss's normaliser is the dense batch's; the update is then the dense trainer's,
  and settings under which it would not be are refused when the trainer is built
  (:mod:`rlcurate.interop.verl_skip`). The dropped groups are observed at the step's end as trained rows (the dense
  trainer trains them, with zero advantage) and then cleared from TransferQueue.

In sync mode the next step's prompts are drawn from the dataloader at the start of the next ``step`` (its
``prepare_step``), after this observation: selection does not lag. Prompts fetched to refill a step (DAPO's
filter, ``sync_refill_failed_groups``: verl's ``_add_prompts_to_generate``) are chosen by the selector's rule among
the prompts the step has not taken (:meth:`CurationSampler.top_up`, ``PromptSelection.more``), as this package's
DAPO refills a step, from the beliefs at the step's start; a resumed run first trains on the prompts the saved
selection had left (they are part of the sampler's state).

SAGE-LIGHT's hints (chapter 7), with ``data.sampler.hints`` set: every prompt verl fetches passes through
``_next_train_batch``, where SAGE-LIGHT's own sampler (:class:`~rlcurate.curation.sage.SageLightSampler`) gives it
the hint level scheduled from its previous visit (the sampler's ``rollout`` run with a ``generate`` that only
records the levels and hint texts); a prompt at a level > 0 gets as its ``raw_prompt`` the task's
chat turns with the hint in the user turn (``task.messages(problem, hint)``; verl's agent loop applies the chat
template), and verl generates and trains on it, as SAGE-LIGHT does. The level of each prompt is kept by its uid
(the first part of every trajectory key), so ``step`` passes each response's level to the selector
(by default INSIGHT takes no evidence from hinted groups, as in this package's trainer; on a revisited pool
pass ``hinted_evidence: failures`` in the strategy's kwargs, chapter 10) and each group's accuracy to the
schedule (every group generated: under DAPO's filter the groups verl evicts too, read before they are cleared, so
an all-wrong group raises its prompt's level as in this package's SAGE-LIGHT). The schedule is saved with the
sampler's state in ``data.pt``. The problems are found by their uids
(``extra_info[hints.uid_key]``, default ``uid``) in the task's splits, and every row's prompt at the strongest
level must fit ``rollout.prompt_length``, when the dataloader is built. Refused: full SAGE (it re-rolls a prompt
whose group is all wrong at the next level within the step, and the sync trainer submits each prompt to its agent
loop once), hints the policy writes itself and hints in the assistant turn.

DAPO's filter (``algorithm.filter_groups``) with a selector that learns from rewards (INSIGHT, MoPPS and the other
belief selectors): verl's replay buffer clears the groups it filters out (and the surplus past the batch) from
TransferQueue before the step ends; a selector that observed only the trained groups would keep a prompt whose
groups are always filtered at its prior, which INSIGHT ranks first, and choose it again and again (a reader's
simulation of verl's refill loop stopped completing steps with 60 % of the pool flat). The trainer therefore keeps
verl's replay buffer but reads each cleared group's responses before it goes
(:class:`EvidenceKeepingReplayBuffer`; a ``trainer.v1.sampler.custom_sampler`` that subclasses verl's buffer
keeps the groups it clears through ``_clear_groups`` too, and one that does not is warned of when the trainer is
built), and the selector observes them at the step's end with the trained ones, as
untrained rows: evidence under ``evidence="generated"`` (the default), left out under ``"trained"``, as this
package's ``insight+dapo`` observes. ``algorithm.adv_estimator=rlcurate_pool_grpo`` is refused
when the trainer is built: verl 0.9.1's ``_compute_advantage`` reads a fixed list of fields from
TransferQueue, without ``reward_baselines``, and nothing in verl 0.9 writes them (appendix A2).

Selecting the trainer::

    VERL_USE_EXTERNAL_MODULES=rlcurate.interop.verl_v1 python3 -m verl.trainer.main_ppo \\
        trainer.v1.trainer_mode=rlcurate_curated data.dataloader_num_workers=0 \\
        +data.sampler.strategy=insight '+data.sampler.strategy_kwargs={mu: 0.3}' +data.sampler.group_size=8 ...

With SAGE-LIGHT's hints (INSIGHT choosing the prompts, or ``strategy=uniform``)::

    ... '+data.sampler.hints={strategy: sage_light, strategy_kwargs: {hint_mode: user, hint_source: task}, task: gsm8k}'

``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import this module in every process, the Ray actor
that runs the trainer included, so the name is registered where ``get_trainer_cls`` looks it up.
Tested with verl 0.9.1 (``tests/test_interop_verl_current.py``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

try:
    import transfer_queue as tq
    from tensordict import TensorDict
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import SYNTHETIC_PADDING_SEQ_LEN
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_base import register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from omegaconf import open_dict
    from verl.utils import tensordict_utils as tu
except ImportError as exc:
    raise ImportError(
        "rlcurate.interop.verl_v1 needs verl >= 0.8 with its v1 trainer (verl.trainer.ppo.v1) and TransferQueue; "
        "tested with verl 0.9.1. With verl 0.5 to 0.7.1 use rlcurate.interop.verl, the curriculum sampler "
        f"(appendix A2). Import failed: {exc}") from exc

from rlcurate.interop._core import check_task_hints, problems_by_uid
from rlcurate.interop.verl import POOL_ADV_ESTIMATOR, CurationSampler, _get, _plain
from rlcurate.interop.verl_skip import advantage_scale, plan_skip, refuse_inexact, skip_requested
from rlcurate.interop.verl_skip import trained_responses  # noqa: F401  (re-exported: the key format lives there)

__all__ = ["CuratedPPOTrainer", "HintSchedule", "HintedCurationSampler", "TRAINER_NAME", "curated_dataloader",
           "refuse_unhostable", "trained_responses", "observe_step", "read_responses", "EvidenceKeeping",
           "EvidenceKeepingReplayBuffer", "keep_evidence"]

TRAINER_NAME = "rlcurate_curated"
logger = logging.getLogger(__name__)


class HintSchedule:
    """SAGE-LIGHT's hints (chapter 7) for the prompts verl 0.9's trainer fetches (module docstring).

    Built from ``data.sampler.hints``: ``strategy`` (``sage_light``), ``strategy_kwargs``, ``task`` and
    ``task_kwargs`` (an rlcurate task with its own hints, :func:`rlcurate.tasks.get_task`), ``uid_key`` (the
    ``extra_info`` key holding each row's problem uid; default ``uid``). Keys are pool positions, as the
    selector's.
    """

    def __init__(self, sampler, task, problems: list):
        self.sampler, self.task, self.problems = sampler, task, problems
        self.level_of: dict[str, int] = {}  # uid of a submitted prompt -> its hint level, until observed
        self.step, self.step_levels = None, []  # the levels of the prompts fetched for the current step

    @staticmethod
    def parse(data_config):
        """``(SAGE-LIGHT's sampler, the task, the options)`` from ``data.sampler.hints``, or None; refuses
        (``ValueError``) what cannot run from the configuration alone, so the trainer can say it when built."""
        cfg = _plain(_get(_get(data_config, "sampler", {}), "hints", None))
        if not cfg:
            return None
        from rlcurate.curation import build_curator
        from rlcurate.curation.base import Processor, Selector
        from rlcurate.curation.sage import SageLightSampler
        from rlcurate.tasks import get_task

        strategy = cfg.get("strategy", "sage_light")
        if strategy == "sage":
            raise ValueError(f"{TRAINER_NAME}: data.sampler.hints.strategy=sage re-rolls an all-wrong group at the "
                             "next hint level within the step, and verl's sync trainer submits each prompt to its "
                             "agent loop once; use sage_light (the level comes from the prompt's previous visit)")
        curator = build_curator(strategy, **(cfg.get("strategy_kwargs") or {}))
        sampler = curator.sampler
        if (not isinstance(sampler, SageLightSampler) or type(curator.selector) is not Selector
                or any(type(p) is not Processor for p in curator.processors)):
            raise ValueError(f"{TRAINER_NAME}: data.sampler.hints.strategy={strategy!r}: only sage_light is hosted "
                             "here (the prompts are chosen by data.sampler.strategy)")
        if not cfg.get("task"):
            raise ValueError(f"{TRAINER_NAME}: data.sampler.hints needs task= (an rlcurate task name: its hints and "
                             "chat turns write the hinted raw_prompt)")
        task = get_task(cfg["task"], **(cfg.get("task_kwargs") or {}))
        check_task_hints(sampler.hints, task, TRAINER_NAME, chat_turns=True)
        return sampler, task, cfg

    @classmethod
    def from_config(cls, data_source, data_config) -> "HintSchedule | None":
        """The schedule ``data.sampler.hints`` asks for, or None; refuses (``ValueError``) what cannot run,
        the training set's rows included (each row's problem, its prompt written by the task)."""
        parsed = cls.parse(data_config)
        if parsed is None:
            return None
        sampler, task, cfg = parsed
        key = cfg.get("uid_key", "uid")
        frame = getattr(data_source, "dataframe", None)
        if frame is None:
            raise ValueError(f"{TRAINER_NAME}: SAGE-LIGHT's hints need verl's RLHFDataset (its rows' extra_info)")
        uids = [info.get(key) if isinstance(info, dict) else None for info in frame["extra_info"]]
        if None in uids:
            raise ValueError(f"{TRAINER_NAME}: row {uids.index(None)} of the training set has no extra_info[{key!r}]: "
                             f"store each problem's uid there (appendix A2, 'The data'), or name the key in "
                             f"data.sampler.hints.uid_key")
        problems = problems_by_uid(task, uids, f"the training set's extra_info[{key!r}]")
        prompt_key = _get(data_config, "prompt_key", "prompt")
        for row, (messages, problem) in enumerate(zip(frame[prompt_key], problems)):
            if [dict(m) for m in messages] != task.messages(problem):  # a hinted prompt must differ by its hint alone
                raise ValueError(f"{TRAINER_NAME}: row {row} of the training set: its {prompt_key!r} is not "
                                 f"task.messages(problem) of uid {problem.uid!r}; write the parquet's prompts with the "
                                 f"task so that a hinted prompt differs from the unhinted one by the hint alone")
        return cls(sampler, task, problems)

    def check_prompt_length(self, tokenizer, limit: int, template_kwargs: dict | None = None) -> int:
        """Refuse (``ValueError``) a training row whose prompt at the strongest hint level is longer than ``limit``
        tokens (``rollout.prompt_length``, beyond which verl's agent loop cuts a prompt's start with a warning),
        rendered as the agent loop renders it (``data.apply_chat_template_kwargs`` as ``template_kwargs``).
        Returns the longest hinted prompt's length."""
        positions = list(range(len(self.problems)))
        ctx = SimpleNamespace(step=-1, task=self.task, problems=self.problems, tokenizer=None)
        texts = self.sampler.hints.hints(ctx, positions)
        longest = 0
        for p in positions:
            for level in range(1, self.sampler.max_level + 1):
                if not texts[p].get(level):
                    continue
                out = tokenizer.apply_chat_template(self.task.messages(self.problems[p], texts[p][level]),
                                                    add_generation_prompt=True, tokenize=True,
                                                    **(template_kwargs or {}))
                n = len(out["input_ids"] if hasattr(out, "keys") else out)
                if n > limit:
                    raise ValueError(f"{TRAINER_NAME}: row {p} (uid {self.problems[p].uid!r}) at hint level {level} is a "
                                     f"prompt of {n} tokens, over actor_rollout_ref.rollout.prompt_length={limit}, and "
                                     f"verl's agent loop would cut its start; raise data.max_prompt_length")
                longest = max(longest, n)
        return longest

    def hint(self, positions, raw_prompts: list, uids: list, step: int) -> list:
        """The ``raw_prompt`` of each fetched prompt: its level's hinted chat turns, or its own at level 0."""
        from rlcurate.curation.base import Group

        positions = [int(p) for p in positions]
        chosen = {}

        def submit(indices, m, hints=None, hint_levels=None, hint_mode=None):  # SAGE-LIGHT's one call: record it
            chosen.update(texts=list(hints), levels=[int(lv) for lv in hint_levels])
            return [Group(index=i, problem=self.problems[i], prompt="", completions=[], rewards=np.zeros(0))
                    for i in indices]

        ctx = SimpleNamespace(step=step, prompts_per_step=len(positions), group_size=0, generate=submit,
                              task=self.task, problems=self.problems, tokenizer=None, render=None)
        self.sampler.rollout(ctx, positions)
        if step != self.step:  # the last step was observed: a uid still here was never trained on (a failed or
            self.step, self.step_levels = step, []  # evicted group) and never will be
            self.level_of.clear()
        self.step_levels += chosen["levels"]
        self.level_of.update(zip(map(str, uids), chosen["levels"]))
        return [raw if text is None else self.task.messages(self.problems[p], text)
                for p, raw, text in zip(positions, raw_prompts, chosen["texts"])]

    def metrics(self) -> dict[str, int]:
        """Prompts fetched at each hint level for the current step (SAGE's ``sage_rolled_level{l}``)."""
        counts = np.bincount(self.step_levels, minlength=self.sampler.max_level + 1)
        return {f"sage_rolled_level{lv}": int(n) for lv, n in enumerate(counts)}

    def levels(self, uids) -> list[int]:
        """The hint level each response's prompt carried (its uid's; 0 for a prompt not fetched by :meth:`hint`)."""
        return [self.level_of.get(str(u), 0) for u in uids]

    def observe(self, positions, scores, uids) -> None:
        """SAGE-LIGHT's accuracy of each group generated (one per fetched prompt, its uid), in the order the
        prompts were fetched, as this package's SAGE-LIGHT observes a step's groups (a prompt fetched twice in one
        step, by refills past the whole pool: the later group decides); forgets those uids."""
        from rlcurate.curation.base import Group

        levels = dict(zip(map(str, uids), self.levels(uids)))
        fetched = {u: k for k, u in enumerate(self.level_of)}  # insertion order: the order of the fetches
        by_uid: dict[str, tuple[int, list[float]]] = {}
        for p, r, u in zip(positions, scores, map(str, uids)):
            by_uid.setdefault(u, (int(p), []))[1].append(float(r))
        groups = [Group(index=p, problem=self.problems[p], prompt="", completions=[None] * len(r),
                        rewards=np.asarray(r), hint_level=levels[u])
                  for u, (p, r) in sorted(by_uid.items(), key=lambda item: fetched.get(item[0], len(fetched)))]
        self.sampler.observe(None, groups)
        for u in set(map(str, uids)):
            self.level_of.pop(u, None)

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


class HintedCurationSampler(CurationSampler):
    """:class:`CurationSampler` that also carries SAGE-LIGHT's :class:`HintSchedule` (and its state in ``data.pt``)."""

    def __init__(self, data_source, data_config, batch_size: int | None = None, hints: HintSchedule | None = None):
        super().__init__(data_source, data_config, batch_size)
        self.hints = hints

    def state_dict(self) -> dict:
        return {**super().state_dict(), "hints": self.hints.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "hints" in state:  # a checkpoint saved before the hints were configured starts the schedule afresh
            self.hints.load_state_dict(state["hints"])


def curated_dataloader(loader: StatefulDataLoader, data_config) -> StatefulDataLoader:
    """verl's training dataloader rebuilt with a :class:`CurationSampler` (same dataset, batch size,
    workers, ``drop_last`` and ``collate_fn``); one selection is ``data.train_batch_size`` prompts. With
    ``data.sampler.hints``, a :class:`HintedCurationSampler`."""
    hints = HintSchedule.from_config(loader.dataset, data_config)
    batch = int(data_config.train_batch_size)
    sampler = (CurationSampler(loader.dataset, data_config, batch_size=batch) if hints is None
               else HintedCurationSampler(loader.dataset, data_config, batch_size=batch, hints=hints))
    return StatefulDataLoader(dataset=loader.dataset, batch_size=loader.batch_size, num_workers=loader.num_workers,
                              drop_last=loader.drop_last, collate_fn=loader.collate_fn, sampler=sampler)


def read_responses(partition_id: str, keys, tags) -> tuple[list[str], list, list[float]]:
    """The responses among ``keys`` that count (:func:`trained_responses`: no padding rows, a multi-turn session's
    last output), with each one's ``index`` and summed ``rm_scores`` read from TransferQueue."""
    rows = trained_responses(keys, tags)
    if not rows:
        return [], [], []
    keys = [keys[r] for r in rows]
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["index", "rm_scores"])
    ids = [i.item() if hasattr(i, "item") else i for i in list(data["index"])]
    scores = [float(s.sum().item()) for s in list(data["rm_scores"])]  # as verl's replay buffer sums them
    return keys, ids, scores


def observe_step(sampler: CurationSampler, batch, skipped=(), untrained=()) -> dict[int, tuple[int, int]]:
    """Feed one step to the sampler: the trained ``KVBatchMeta``'s responses (:func:`read_responses`), the
    ``skipped`` ones (the flat groups ``skip_zero_advantage`` dropped: trained, as the dense trainer would train
    them with zero advantage) and the ``untrained`` ones (DAPO's filtered groups, the surplus), each
    ``(keys, ids, scores)`` read before verl cleared them, with the hint level of each prompt where SAGE-LIGHT
    hinted it (then the schedule observes the step too). Returns ``{prompt position: (successes, responses)}``."""
    keys, ids, scores = read_responses(batch.partition_id, batch.keys, batch.tags)
    trained = [True] * len(keys)
    for rows, were_trained in [(r, True) for r in skipped] + [(r, False) for r in untrained]:
        more_keys, more_ids, more_scores = rows
        keys, ids, scores = keys + list(more_keys), ids + list(more_ids), scores + list(more_scores)
        trained += [were_trained] * len(more_keys)
    if not keys:
        return {}
    hints = getattr(sampler, "hints", None)
    if hints is None:
        return sampler.observe(ids, scores, trained_rows=trained)
    uids = [key.rsplit("_", 2)[0] for key in keys]
    counts = sampler.observe(ids, scores, hints.levels(uids), trained_rows=trained)
    hints.observe(sampler.positions(ids), scores, uids)
    return counts


class EvidenceKeeping:
    """A replay buffer (verl's :class:`ReplayBuffer` or a subclass) that reads the responses of the training groups
    it clears with ``_clear_groups`` (DAPO's filtered groups, the surplus past the batch) before clearing them, into
    ``cleared``, for the trainer to observe at the step's end: a selector that never saw them would keep a filtered
    prompt at its prior, which INSIGHT ranks first."""

    cleared: list

    def _clear_groups(self, partition_id: str, uids: set[str]) -> None:
        if partition_id == "train" and uids:
            keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in uids]
            self.cleared.append(read_responses(partition_id, keys, [self.partitions[partition_id][k] for k in keys]))
        super()._clear_groups(partition_id, uids)


class EvidenceKeepingReplayBuffer(EvidenceKeeping, ReplayBuffer):
    """verl's own replay buffer, keeping the evidence of the groups it clears (:class:`EvidenceKeeping`)."""


def keep_evidence(buffer) -> bool:
    """Make ``buffer`` keep the evidence of the groups it clears, in place (its class swapped for one with
    :class:`EvidenceKeeping` first): verl's own buffer, or a ``custom_sampler`` that subclasses it (the groups its
    filter clears through ``_clear_groups``). False for a buffer that is not a :class:`ReplayBuffer`."""
    cls = type(buffer)
    if not isinstance(buffer, ReplayBuffer):
        return False
    if not isinstance(buffer, EvidenceKeeping):
        buffer.__class__ = (EvidenceKeepingReplayBuffer if cls is ReplayBuffer
                            else type(f"EvidenceKeeping{cls.__name__}", (EvidenceKeeping, cls), {}))
    if not isinstance(getattr(buffer, "cleared", None), list):  # a user's subclass of EvidenceKeeping too
        buffer.cleared = []
    return True


def refuse_unhostable(config) -> None:
    """Refuse (``ValueError``, one line) what the registered trainer cannot run, from the configuration alone: the
    pool-baseline estimator, ``skip_zero_advantage`` where it would change the update, a hint configuration that
    cannot run."""
    if config.algorithm.adv_estimator == POOL_ADV_ESTIMATOR:
        raise ValueError(f"{TRAINER_NAME} cannot run algorithm.adv_estimator={POOL_ADV_ESTIMATOR}: verl 0.9's "
                         "_compute_advantage never passes reward_baselines to an estimator (appendix A2)")
    if skip_requested(config):
        refuse_inexact(config, TRAINER_NAME)
    HintSchedule.parse(config.data)  # refuses a hint configuration that cannot run


@register_trainer(TRAINER_NAME)
class CuratedPPOTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with an rlcurate prompt-selection strategy as its sampler."""

    def __init__(self, config):
        refuse_unhostable(config)  # before anything starts
        self.skip_zero_advantage = skip_requested(config)
        self._skipped: list[KVBatchMeta] = []  # this step's dropped rows, observed and cleared after it
        self._advantage_scale = 1.0  # for the batch between _balance_batch and _compute_advantage
        self._warned_inexact = False
        self._step_prompts: list[int] = []  # pool positions fetched for the step now running (top-ups leave them out)
        self._topped_up = False  # whether the step now running has had a top-up
        with open_dict(config):  # verl 0.9.1 tests for the literal mode "sync" (replay buffer, refills, resume)
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        keep_evidence(buffer)  # verl's own (or a subclass): kept, the cleared groups read
        return buffer

    def _init_dataloader(self):
        super()._init_dataloader()
        self.train_dataloader = curated_dataloader(self.train_dataloader, self.config.data)
        self.train_dataloader_it = None
        # rollout.n, not learnt from a step's rows, where a prompt the step took twice (top-ups past the whole
        # pool) has twice as many
        self.train_dataloader.sampler.fix_group_size(int(self.config.actor_rollout_ref.rollout.n))
        selector = self.train_dataloader.sampler.selection.selector
        # keep_evidence again here (it is idempotent): a subclass may have built the buffer its own way
        if not keep_evidence(self.replay_buffer) and hasattr(selector, "beliefs"):
            logger.warning("%s: trainer.v1.sampler.custom_sampler %s is not a verl ReplayBuffer: the groups it drops "
                           "before a step ends (a filter's) never reach the %s selector, which keeps their prompts at "
                           "their prior", TRAINER_NAME, type(self.replay_buffer).__name__, selector.name)
        hints = getattr(self.train_dataloader.sampler, "hints", None)
        if hints is not None:
            hints.check_prompt_length(self.tokenizer, int(self.config.actor_rollout_ref.rollout.prompt_length),
                                      dict(self.config.data.get("apply_chat_template_kwargs", None) or {}))

    def _next_train_batch(self, num_prompts: int | None = None):
        batch = super()._next_train_batch(num_prompts)
        self._step_prompts += self.train_dataloader.sampler.positions(list(batch["index"])).tolist()
        hints = getattr(self.train_dataloader.sampler, "hints", None)
        if hints is not None:
            sampler = self.train_dataloader.sampler
            raw = hints.hint(sampler.positions(list(batch["index"])), list(batch["raw_prompt"]), list(batch["uid"]),
                             self.global_steps)
            tu.assign_non_tensor_stack(batch, "raw_prompt", raw)
        return batch

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        # verl's refills within a step (DAPO's filter, sync_refill_failed_groups): chosen by the selector's rule
        # among the prompts the step has not taken, as this package's DAPO refills, not the next step's selection
        if num_prompts > 0:  # verl refuses the rest itself
            first = not self._topped_up  # later ones: the selector counts (a step may take the whole pool)
            self.train_dataloader.sampler.top_up(num_prompts, self._step_prompts if first else None)
            self._topped_up = True
        return super()._add_prompts_to_generate(num_prompts)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        if not self.skip_zero_advantage:
            return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        dense = [tag.get("seq_len", 0) for tag in batch.tags if not tag.get("is_padding", False)]
        batch = self._drop_zero_advantage_groups(batch, metrics)
        batch = super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        # what the passes over the batch cost in tokens (prompt and response), against the dense batch padded the
        # same way: verl's padding rows are SYNTHETIC_PADDING_SEQ_LEN tokens long, so a row shorter than that costs
        # more skipped than trained
        multiple = self._get_required_batch_multiple(max(self.actor_rollout_wg._dispatch_info["actor"]) + 1)
        dense_tokens = sum(dense) + SYNTHETIC_PADDING_SEQ_LEN * (-len(dense) % multiple)
        if dense_tokens:
            metrics["rlcurate/skip_net_token_share"] = 1 - sum(t.get("seq_len", 0) for t in batch.tags) / dense_tokens
        return batch

    def _drop_zero_advantage_groups(self, batch, metrics: dict):
        """``data.sampler.skip_zero_advantage``: the batch without its flat groups and padding
        (:func:`rlcurate.interop.verl_skip.plan_skip`); the dropped rows wait in ``_skipped`` for the step's end."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["rm_scores", "response_mask"])
        scores = [float(s.sum().item()) for s in list(data["rm_scores"])]  # as verl's DAPO filter sums them
        tokens = [int(m.sum().item()) for m in list(data["response_mask"])]
        actor, n = self.config.actor_rollout_ref.actor, int(self.config.actor_rollout_ref.rollout.n)
        plan = plan_skip(batch.keys, batch.tags, scores, tokens, mini_batch_rows=int(actor.ppo_mini_batch_size) * n)
        metrics.update(plan.metrics())
        if plan.inexact and not self._warned_inexact:
            self._warned_inexact = True
            logger.warning("%s: a batch of %d rows is longer than one mini-batch (ppo_mini_batch_size x rollout.n = "
                           "%d): it is trained whole, since fewer rows would take fewer optimizer steps (metric "
                           "rlcurate/skip_inexact)", TRAINER_NAME, len(batch.keys), int(actor.ppo_mini_batch_size) * n)
        self._advantage_scale = advantage_scale(plan, actor.loss_agg_mode)
        if not plan.drop:
            return batch

        def rows(positions):
            return KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[r] for r in positions],
                               tags=[batch.tags[r] for r in positions], fields=batch.fields,
                               extra_info=batch.extra_info)

        self._skipped.append(rows(plan.drop))
        return rows(plan.keep)

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        scale, self._advantage_scale = self._advantage_scale, 1.0
        if scale != 1.0:  # token-mean's divisor fell with the dropped tokens: scale the kept advantages to match
            adv = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages"])
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                            fields=TensorDict({"advantages": adv["advantages"] * scale}, batch_size=len(batch.keys)))
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        # once per step, after all its updates: with parameter_sync_step = k the k batches of one selection are
        # observed together, as one step's rewards (a strategy that decays its beliefs per observation decays once)
        batch = super().step(metrics, timing_raw)
        sampler = self.train_dataloader.sampler
        skipped, self._skipped = self._skipped, []
        flat = [read_responses(b.partition_id, b.keys, b.tags) for b in skipped]  # trained, as the dense batch
        cleared = getattr(self.replay_buffer, "cleared", None) or []  # DAPO's evictions and the surplus: untrained
        observe_step(sampler, batch, flat, list(cleared))
        cleared.clear()
        self._step_prompts, self._topped_up = [], False
        for dropped in skipped:  # verl clears the trained keys after its metrics; these it never saw
            tq.kv_clear(keys=dropped.keys, partition_id=dropped.partition_id)
        metrics.update({f"rlcurate/{k}": v for k, v in sampler.selection.metrics().items()})
        if getattr(sampler, "hints", None) is not None:
            metrics.update({f"rlcurate/{k}": v for k, v in sampler.hints.metrics().items()})
        return batch
