"""rlcurate's prompt selection as a verl curriculum sampler (appendix A2, *Scaling out with verl*).

verl's ``RayPPOTrainer`` builds its training sampler from the config::

    data.sampler.class_path=pkg://rlcurate.interop.verl
    data.sampler.class_name=CurationSampler
    +data.sampler.strategy=insight                 # insight | mopps | expected_difficulty |
                                                   # inverse_evidence | prefilter | uniform
    +data.sampler.strategy_kwargs='{mu: 0.3}'      # the strategy's keyword arguments
    +data.sampler.group_size=8                     # = actor_rollout_ref.rollout.n (INSIGHT's K)
    data.dataloader_num_workers=0                  # verl asserts it for curriculum samplers

calls ``CurationSampler(data_source=dataset, data_config=config.data)``, iterates it through a
``StatefulDataLoader`` whose batch size is ``data.gen_batch_size`` (or ``data.train_batch_size``),
and after every step of ``fit()`` calls ``sampler.update(batch)`` with the step's whole ``DataProto``.
:meth:`CurationSampler.update` reads each response's prompt from ``batch.non_tensor_batch["index"]``, or
``extra_info["index"]`` where ``fit()`` left no ``index`` (:func:`prompt_ids`), mapped to a row position, and its
reward from
``batch.batch["token_level_scores"].sum(-1)``; the batch may be in any order (verl balances it
across ranks), since responses are grouped by prompt index.

The sampler runs in verl's single driver process, so there is nothing to gather across GPUs, and
with ``dataloader_num_workers=0`` the dataloader fetches a batch only when ``fit()`` asks for it: the
prompts of step t + 1 are chosen after ``update`` has seen step t (no lag, unlike TRL, appendix A2).

Its state (beliefs, selection round, position in the epoch) is part of the ``StatefulDataLoader``
state that verl saves in ``data.pt`` with each checkpoint: torchdata's batch-sampler iterator calls
:meth:`state_dict` on any sampler that has one, and :meth:`load_state_dict` on resume.

Versions: the curriculum-sampler hook (``verl.experimental.dataset.sampler.AbstractCurriculumSampler``
and ``data.sampler.class_path``) exists in verl 0.5 to 0.7.1 on PyPI and was removed in 0.8.0. With a
verl that lacks it, this class is a plain ``torch.utils.data.Sampler``, and
:mod:`rlcurate.interop.verl_v1` puts it into verl's v1 trainer instead: a trainer registered as
``rlcurate_curated`` (``trainer.v1.trainer_mode=rlcurate_curated``) builds its dataloader with this sampler
and feeds it each step's rewards through :meth:`CurationSampler.observe` (tested with verl 0.9.1).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch

from rlcurate.interop._core import PromptSelection

log = logging.getLogger(__name__)

try:
    import verl  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without verl
    raise ImportError("rlcurate.interop.verl needs verl (tested with verl 0.7.1; see appendix A2 for the "
                      "install without its GPU-only dependencies)") from exc

def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


VERL_VERSION = _version(getattr(verl, "__version__", "0"))
TESTED_VERL = (0, 7, 1)
"""The verl release this adapter was tested against with verl's own classes (appendix A2)."""

try:
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler as _SamplerBase

    HAS_CURRICULUM_HOOK = True
except ImportError:  # verl >= 0.8 removed the hook
    _SamplerBase = torch.utils.data.Sampler
    HAS_CURRICULUM_HOOK = False

__all__ = ["CurationSampler", "HAS_CURRICULUM_HOOK", "VERL_VERSION", "TESTED_VERL", "dataset_indices", "pool_baseline_advantage",
           "register_advantage_estimators", "POOL_ADV_ESTIMATOR"]

POOL_ADV_ESTIMATOR = "rlcurate_pool_grpo"


def _get(cfg, key, default=None):
    """``cfg.key`` for an OmegaConf ``DictConfig``, a dict or an object; ``default`` when missing or null."""
    if cfg is None:
        return default
    if hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


def _plain(value):
    """An OmegaConf container as plain Python (for the strategy's keyword arguments)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


def dataset_indices(data_source) -> list | None:
    """Each row's ``extra_info["index"]`` (what verl puts in ``non_tensor_batch["index"]``), read from
    the dataset's ``dataframe`` (verl's ``RLHFDataset``) without tokenising anything; ``None`` when the
    dataset does not expose one."""
    frame = getattr(data_source, "dataframe", None)
    if frame is None:
        return None
    try:
        infos = frame["extra_info"]
    except (KeyError, TypeError, ValueError):
        return None
    out = []
    for info in infos:
        out.append(info.get("index", 0) if isinstance(info, dict) else 0)
    return out


class CurationSampler(_SamplerBase):
    """A verl ``AbstractCurriculumSampler`` running an rlcurate prompt-level strategy.

    Args:
        data_source: the training dataset (verl's ``RLHFDataset`` or any sized dataset).
        data_config: verl's ``config.data``; reads ``gen_batch_size`` or ``train_batch_size`` (prompts
            per step), ``seed``, and under ``sampler``: ``strategy`` (default ``insight``),
            ``strategy_kwargs``, ``group_size`` (responses per prompt; default: learnt from the first
            update, 8 before it), ``uid_key`` (an ``extra_info`` key holding stable ids for the
            prefilter's audit file; default the index).
        batch_size: prompts per selection, when it is not the dataloader's batch size (verl 0.9's
            trainer fetches one prompt at a time under DAPO; :mod:`rlcurate.interop.verl_v1`).

    Prompt ids: verl reports each response's ``extra_info["index"]``. When the dataset exposes its rows
    (``RLHFDataset.dataframe``), the sampler maps those ids to row positions (so filtered or reordered
    datasets work); they must be unique. Otherwise the id must be the row position.
    """

    def __init__(self, data_source, data_config, batch_size: int | None = None):
        self.data_source = data_source
        n = len(data_source)
        self.batch_size = int(batch_size or _get(data_config, "gen_batch_size", None)
                              or _get(data_config, "train_batch_size"))
        if self.batch_size < 1 or self.batch_size > n:
            raise ValueError(f"prompts per step ({self.batch_size}) must lie in [1, {n}] (the dataset size)")
        if int(_get(data_config, "dataloader_num_workers", 0)) != 0:
            raise ValueError("set data.dataloader_num_workers=0: worker prefetching would choose prompts before "
                             "the rewards of the previous step arrive")
        scfg = _get(data_config, "sampler", {})
        strategy = _get(scfg, "strategy", "insight")
        kwargs = dict(_plain(_get(scfg, "strategy_kwargs", {})) or {})
        self._group_size_fixed = _get(scfg, "group_size", None)
        seed = int(_get(scfg, "seed", None) if _get(scfg, "seed", None) is not None else _get(data_config, "seed", 0))

        ids = dataset_indices(data_source)
        if ids is not None:
            if len(set(map(str, ids))) != len(ids):
                raise ValueError("the dataset's extra_info['index'] values are not unique (verl defaults them to "
                                 "0): give every row its own index so that rewards can be traced to prompts")
            self._position = {str(v): p for p, v in enumerate(ids)}
        else:
            self._position = None
        uids = None
        uid_key = _get(scfg, "uid_key", None)
        frame = getattr(data_source, "dataframe", None)
        if uid_key is not None and frame is not None:
            uids = [str(info.get(uid_key)) for info in frame["extra_info"]]
        elif ids is not None:
            uids = [str(v) for v in ids]
        self.selection = PromptSelection(strategy, n, group_size=int(self._group_size_fixed or 8), seed=seed,
                                         uids=uids, **kwargs)
        self.chunks_per_epoch = n // self.batch_size
        self._epoch_pos = 0  # chunks already chosen in the current epoch
        self._pending: list[int] = []  # the chosen chunk's prompts not yet handed to the dataloader
        self._top_ups: list[int] = []  # more prompts for the step now running (top_up), handed out first
        self.last_update: dict[int, tuple[int, int]] = {}
        self.hosted = None  # a rollout wrapper whose strategy state travels with this sampler's (attach)
        self._hosted_state: dict | None = None  # restored before the wrapper was attached

    # ------------------------------------------------------------------ sampling
    def __iter__(self):
        # A chunk is chosen when its first prompt is needed and handed out one prompt at a time; what is left of
        # it is part of the state, so a run resumed from a checkpoint taken mid-chunk (verl 0.9 under DAPO fetches
        # one prompt at a time) trains on the prompts the uninterrupted run would have, and selects when it would.
        while self._top_ups or self._pending or self._epoch_pos < self.chunks_per_epoch:  # resumes mid-epoch too
            if self._top_ups:
                yield self._top_ups.pop(0)
                continue
            if not self._pending:
                self._warn_if_unfed()
                self._pending = list(self.selection.select(self.batch_size))  # a copy: the history keeps its own
                self._epoch_pos += 1
            yield self._pending.pop(0)
        self._epoch_pos = 0

    def __len__(self) -> int:
        return self.chunks_per_epoch * self.batch_size

    def top_up(self, k: int, taken=None) -> None:
        """The next ``k`` prompts handed out are ``k`` more for the step now running, chosen by the selector's rule
        among the prompts the step has not taken (:meth:`PromptSelection.more`, as this package's DAPO refills a
        step): verl 0.9's refills under DAPO's filter (:mod:`rlcurate.interop.verl_v1`). ``taken``: the step's pool
        positions so far, given with its first top-up only (the selector then keeps count, and starts a new pass
        when the step has taken the whole pool)."""
        self._top_ups += self.selection.more(int(k), taken=None if taken is None else [int(i) for i in taken])

    def fix_group_size(self, n: int) -> None:
        """Responses per prompt (INSIGHT's K) given by the host (``rollout.n``), where ``data.sampler.group_size``
        is unset, in place of learning it from each step's rows."""
        if self._group_size_fixed is None:
            self._group_size_fixed = self.selection.group_size = int(n)

    UNFED_LIMIT = 3
    """Selections made with no reward observed since the sampler began, past which :meth:`__iter__` warns once."""

    def _warn_if_unfed(self) -> None:
        """A selector that learns from rewards but is never fed chooses as at the start (verl's DAPO recipe,
        ``RayDAPOTrainer.fit``, never calls ``sampler.update``): said once, naming the cause."""
        if (not getattr(self, "_warned_unfed", False) and self.selection.observed == 0
                and self.selection.rounds >= self.UNFED_LIMIT and hasattr(self.selection.selector, "beliefs")):
            warnings.warn(f"CurationSampler: {self.selection.rounds} selections and no rewards observed: the "
                          f"{self.selection.selector.name} selector is choosing without feedback; the trainer must call "
                          f"sampler.update(batch) after each step (RayPPOTrainer.fit does, verl's DAPO recipe does not)",
                          stacklevel=3)
            self._warned_unfed = True

    # ------------------------------------------------------------------ feedback
    def positions(self, ids) -> np.ndarray:
        """Row positions of verl prompt ids (``non_tensor_batch["index"]``)."""
        ids = np.asarray(ids, dtype=object).reshape(-1)
        if self._position is None:
            return np.asarray([int(i) for i in ids], dtype=np.int64)
        try:
            return np.asarray([self._position[str(i)] for i in ids], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"prompt id {exc.args[0]!r} is not an extra_info['index'] of the training set") from None

    def update(self, batch) -> None:
        """Observe one step of verl 0.7 (a ``DataProto``): every response's prompt id and summed
        token-level score, and what the rollout wrapper (:mod:`rlcurate.interop.verl_rollout`) wrote: its
        ``hint_level`` (SAGE) and the unhinted rollouts generated for its prompt, ``pool_successes`` and
        ``pool_size`` (Reinforce-Ada's whole pool, SAGE's level-0 group), so that the selector learns from
        what was generated, not from the rows the wrapper kept."""
        nt = batch.non_tensor_batch
        self.observe(prompt_ids(nt), batch.batch["token_level_scores"].sum(-1).detach().float().cpu().numpy(),
                     nt.get("hint_level"), nt.get("pool_successes"), nt.get("pool_size"))

    def observe(self, ids, scores, hint_levels=None, pool_successes=None, pool_sizes=None,
                trained_rows=None) -> dict[int, tuple[int, int]]:
        """Observe one step's responses, in any order: ``ids[j]`` is response j's prompt id (its
        ``extra_info["index"]``), ``scores[j]`` its reward, ``hint_levels[j]`` the hint its prompt carried
        (default none; the selector's own rule decides what a hinted group says, chapter 10),
        ``pool_successes[j]`` and ``pool_sizes[j]`` the unhinted rollouts of its prompt this step when the
        batch holds only some, ``trained_rows[j]`` whether it was trained (default all: a filter's dropped groups
        are evidence for ``evidence="generated"`` only; :meth:`rlcurate.interop._core.PromptSelection.observe`). The responses of a
        prompt at one hint level form one group. Shared by :meth:`update` and verl 0.9's registered trainer
        (:mod:`rlcurate.interop.verl_v1`)."""
        pos = self.positions(ids)
        scores = np.asarray(scores, dtype=float).reshape(-1)
        if self._group_size_fixed is None and pos.size:
            self.selection.group_size = int(np.bincount(pos).max())  # responses per prompt (rollout.n)
        levels = None if hint_levels is None else np.asarray(hint_levels, dtype=np.int64).reshape(-1)
        self.last_update = self.selection.observe(pos, scores, levels, pool_successes, pool_sizes,
                                                  trained_rows=trained_rows)
        return self.last_update

    # ------------------------------------------------------------------ checkpoint
    def attach(self, hosted) -> None:
        """Carry ``hosted``'s state (``state_dict``/``load_state_dict``; a
        :class:`~rlcurate.interop.verl_rollout.CuratedRollout`'s SAGE-LIGHT levels) in this sampler's, which verl
        saves in each checkpoint; a state restored before it was attached is handed to it now."""
        self.hosted = hosted
        if self._hosted_state is not None:
            hosted.load_state_dict(self._hosted_state)
            self._hosted_state = None

    def state_dict(self) -> dict[str, Any]:
        state = {"selection": self.selection.state_dict(), "epoch_pos": self._epoch_pos, "pending": list(self._pending)}
        if self.hosted is not None:
            state["hosted"] = self.hosted.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.selection.load_state_dict(state["selection"])
        if self._group_size_fixed is not None:  # the configuration's (or rollout.n), not the checkpoint's
            self.selection.group_size = int(self._group_size_fixed)
        self._epoch_pos = int(state["epoch_pos"])
        self._pending = [int(i) for i in state.get("pending", [])]  # absent from checkpoints before it was kept
        if state.get("hosted") is not None:
            if self.hosted is not None:
                self.hosted.load_state_dict(state["hosted"])
            else:
                self._hosted_state = state["hosted"]


def prompt_ids(non_tensors) -> np.ndarray:
    """Each response's prompt id in a verl 0.7 training batch: ``index``, else ``extra_info["index"]``.

    ``RLHFDataset`` copies ``extra_info["index"]`` to ``index``, but ``fit()`` moves ``index`` into the
    generation batch (``_get_gen_batch`` keeps only the reward keys) and the agent loop copies it back only
    when no reward-loop workers stream the rewards, which they do by default (no reward model); then
    ``extra_info``, a reward key, still holds the id."""
    if "index" in non_tensors:
        return np.asarray(non_tensors["index"], dtype=object)
    extra = non_tensors.get("extra_info")
    if extra is None or any(not isinstance(e, dict) or "index" not in e for e in extra):
        raise ValueError("the training batch has neither non_tensor_batch['index'] nor an extra_info['index'] in "
                         "every row: store each prompt's row number as extra_info['index'] in the parquet files")
    return np.asarray([e["index"] for e in extra], dtype=object)


# ---------------------------------------------------------------------------------------------- advantages
def pool_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                            reward_baselines: torch.Tensor | None = None, epsilon: float = 1e-6,
                            norm_adv_by_std_in_grpo: bool = True, config=None, pool_sizes=None, **kwargs):
    """GRPO's advantage with the baseline of a larger pool (chapter 6; Reinforce-Ada's p_hat), as a
    verl advantage estimator (registered as ``algorithm.adv_estimator=rlcurate_pool_grpo``).

    A strategy that sampled more rollouts per prompt than it trains on (Reinforce-Ada's rounds, a
    DAPO-style refill) knows each prompt's pass rate p_hat = N_pos / N from the whole pool of N; it
    stores it per response in ``batch.batch["reward_baselines"]``, which verl's ``compute_advantage``
    passes to the estimator (and nothing else of the batch). Give the pool size too, either as a second
    column, ``reward_baselines`` of shape [batch, 2] holding (p_hat, N), which verl passes through
    unchanged, or as ``pool_sizes`` when calling this function from your own ``fit()``. Then the
    advantage is :func:`rlcurate.stats.advantages.pool_advantages`, the same function rlcurate's trainer
    uses: A = (r - p_hat) / (s + eps), s = max(sqrt(p_hat (1 - p_hat) N / (N - 1)), 1 / sqrt(N)), or
    r - p_hat without the std (``norm_adv_by_std_in_grpo=False``, Dr. GRPO). That is exactly the
    official global-statistics advantage (RLHFlow/Reinforce-Ada, ``global_stat_est=True``: mean and
    Bessel std of N_pos ones and N - N_pos zeros) for every pool holding both classes; on a pool of one
    class with graded rewards the official std is clamped at eps instead (advantages up to 1 / (2 eps)),
    and a pool of one rollout gets 0 here where the official code gives r / (1 + eps).

    With a 1-D ``reward_baselines`` (N unknown) the std is the population one, sqrt(p_hat (1 - p_hat)),
    so every advantage is exactly sqrt(N / (N - 1)) times the official one: 1.069 for pools of 8,
    1.033 for 16, 1.016 for 32; a pool of one class (p_hat 0 or 1) then takes the floor 1 / sqrt(m),
    m the prompt's responses in the batch. Without ``reward_baselines`` this is verl's GRPO on verl 0.7, and
    refused on verl 0.8 and later, whose trainers never pass them (it would be GRPO without a word).
    Returns (advantages, returns), both [batch, response_length], zero outside the response.
    verl calls it with its ``AlgoConfig`` as ``config``, whose ``norm_adv_by_std_in_grpo`` then decides, as it
    does for verl's own registered estimators.
    """
    if config is not None:
        norm_adv_by_std_in_grpo = bool(config.get("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo))
    if reward_baselines is None and VERL_VERSION >= (0, 8):
        raise ValueError(f"{POOL_ADV_ESTIMATOR} received no reward_baselines: verl "
                         f"{'.'.join(map(str, VERL_VERSION))}'s trainer passes a fixed list of fields to a registered "
                         f"advantage estimator, so the pool baseline never arrives and this would silently be plain "
                         f"GRPO. Use algorithm.adv_estimator=grpo there, or verl "
                         f"{'.'.join(map(str, TESTED_VERL))} (appendix A2)")
    if reward_baselines is None:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon,
                                              norm_adv_by_std_in_grpo, config)
    from rlcurate.stats.advantages import pool_advantages

    scores = token_level_rewards.sum(dim=-1)
    rb = reward_baselines.detach().to(torch.float64).cpu().numpy()
    if rb.ndim == 2 and rb.shape[-1] == 2 and pool_sizes is None:
        p, n = rb[:, 0], rb[:, 1]
    else:
        p = rb.reshape(-1)
        n = None if pool_sizes is None else np.asarray(
            pool_sizes.detach().cpu().numpy() if torch.is_tensor(pool_sizes) else pool_sizes, dtype=float).reshape(-1)
    r = scores.detach().to(torch.float64).cpu().numpy()
    kind = "grpo" if norm_adv_by_std_in_grpo else "drgrpo"
    if n is not None:
        adv = pool_advantages(r, p, n, kind, epsilon)
    elif kind == "drgrpo":
        adv = r - p
    else:
        std = np.sqrt(np.clip(p * (1 - p), 0.0, None))
        ids = np.asarray(index, dtype=object).reshape(-1) if index is not None else np.arange(r.size)
        _, inverse, counts = np.unique(ids.astype(str), return_inverse=True, return_counts=True)
        floor = 1.0 / np.sqrt(counts[inverse])
        std = np.where(std > 0, np.maximum(std, epsilon), floor)
        adv = (r - p) / (std + epsilon)
    out = torch.as_tensor(adv, dtype=scores.dtype, device=scores.device).unsqueeze(-1) * response_mask
    return out, out


def register_advantage_estimators() -> bool:
    """Register :func:`pool_baseline_advantage` with verl's ``register_adv_est`` under
    :data:`POOL_ADV_ESTIMATOR` (once; done when this module is imported). False when verl's
    ``core_algos`` cannot be imported here."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as exc:  # e.g. codetiming missing
        log.debug("verl core_algos unavailable (%s); advantage estimator not registered", exc)
        return False
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(POOL_ADV_ESTIMATOR) is not None:
        return True
    core_algos.register_adv_est(POOL_ADV_ESTIMATOR)(pool_baseline_advantage)
    return True


register_advantage_estimators()
