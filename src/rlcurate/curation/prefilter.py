"""An offline variance prefilter (chapter 6, *Adaptive sampling*; the audit is chapter 4).

Before training, sample every prompt of the pool ``audit_runs`` times with the current policy and keep
the prompts whose audit group was *mixed* (at least one success and one failure): the others would
most likely give uniform groups, hence zero advantage, during training as well. Training then walks
epochs over the kept subset only. This is the cheap, static cousin of DAPO's dynamic sampling: it pays
the audit once instead of oversampling at every step, but its verdicts go stale as the policy moves,
which ``reaudit_every`` addresses.

With ``audit_runs`` = k a prompt of pass rate p passes the audit with probability
1 - p^k - (1 - p)^k (the gate of chapter 1), so the prefilter keeps almost every prompt with
moderate p and drops most prompts near 0 and 1.

The kept subset comes either from a file (``audit_file``: JSON lines with a ``"uid"`` key, e.g. the
``mixed.jsonl`` that ``rlcurate audit`` writes, whose lines also name the audited ``split``) or from an
in-process audit at the first step through ``ctx.generate`` (so its rollouts count toward that step's
compute). Training draws from the ``train`` split: an export of another split matches none of its
prompts and is refused with a message that says to audit ``--split train``.

Re-audit (``reaudit_every`` = k > 0): at every k-th step the selector re-audits the prompts it keeps
plus ``reaudit_fresh`` prompts drawn at random from those it dropped (``None``: all of them, a full
re-audit). Kept prompts that come back uniform are dropped, dropped prompts that come back mixed are
re-admitted; a new epoch over the new subset starts. The default ``None`` is the simple, expensive
choice (the whole audited pool each time); a number bounds the cost while still letting prompts the
policy has grown into come back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlcurate.curation.base import Curator, Sampler, Selector, StepContext
from rlcurate.curation.registry import StrategyConfig, register
from rlcurate.seeding import stream
from rlcurate.errors import UserError

__all__ = ["PrefilterSelector", "PrefilterConfig", "read_audit_rows", "read_audit_uids"]

log = logging.getLogger(__name__)


def read_audit_rows(path: str | Path) -> list[dict]:
    """The JSON object of every line of an audit file (blank lines skipped), in file order; each must
    have a ``uid``. :class:`~rlcurate.errors.UserError` names the file and line of a bad one."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"audit_file not found: {path}")
    rows = []
    for k, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:  # invalid JSON or not UTF-8
            raise UserError(f"audit_file {path}, line {k}: not a JSON line ({exc})") from None
        if not isinstance(row, dict) or "uid" not in row:
            raise UserError(f"audit_file {path}, line {k}: each line must be an object with a 'uid' key, "
                            f"got {line[:80].decode(errors='replace')!r}")
        rows.append(row)
    return rows


def read_audit_uids(path: str | Path) -> list[str]:
    """The ``uid`` of every JSON line of an audit file (blank lines skipped), in file order."""
    return [str(row["uid"]) for row in read_audit_rows(path)]


def _positive_int(name: str, v, allow_zero: bool = False) -> int:
    lo = 0 if allow_zero else 1
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


class PrefilterSelector(Selector):
    """Epochs, in a seeded random order, over the prompts an audit found mixed.

    Args:
        audit_file: JSON lines with the uids to keep; ``None`` audits in-process at the first step.
        audit_runs: rollouts per prompt of an in-process audit or re-audit (default 8).
        audit_prompts: audit only this many prompts drawn at random from the pool (the others are
            never trained on); ``None`` audits the whole pool. Bounds the cost on large pools.
        reaudit_every: re-audit every this many steps with the current policy (0: never).
        reaudit_fresh: dropped prompts re-audited along with the kept ones (``None``: all of them).
        fallback: what to do when an audit finds no mixed prompt at all: ``"error"`` (default)
            raises; ``"all"`` logs a warning and trains on every audited prompt. A re-audit that finds
            nothing keeps the previous subset (with a warning).
    """

    name = "prefilter"

    def __init__(self, audit_file: str | None = None, audit_runs: int = 8, audit_prompts: int | None = None,
                 reaudit_every: int = 0, reaudit_fresh: int | None = None, fallback: str = "error"):
        super().__init__()
        self.audit_file = None if audit_file is None else str(audit_file)
        self.audit_runs = _positive_int("audit_runs", audit_runs)
        self.audit_prompts = None if audit_prompts is None else _positive_int("audit_prompts", audit_prompts)
        self.reaudit_every = _positive_int("reaudit_every", reaudit_every, allow_zero=True)
        self.reaudit_fresh = None if reaudit_fresh is None else _positive_int("reaudit_fresh", reaudit_fresh,
                                                                              allow_zero=True)
        if fallback not in ("error", "all"):
            raise ValueError(f"fallback must be 'error' or 'all', got {fallback!r}")
        self.fallback = fallback
        self.universe: list[int] | None = None  # the prompts audited (the pool or a sample of it)
        self.kept: list[int] | None = None
        self.audited_at = -1
        self.audit_rollouts = 0
        self._warned_small = False

    # ------------------------------------------------------------------ auditing
    def _audit(self, ctx: StepContext, indices: list[int]) -> set[int]:
        groups = ctx.generate(indices, self.audit_runs)
        self.audit_rollouts += sum(g.generated for g in groups)
        return {g.index for g in groups if g.mixed}

    def _universe(self) -> list[int]:
        if self.audit_prompts is None or self.audit_prompts >= self.n_items:
            return list(range(self.n_items))
        pick = stream("prefilter_pick", self.seed).choice(self.n_items, size=self.audit_prompts, replace=False)
        return sorted(int(i) for i in pick)

    def _initial(self, ctx: StepContext) -> None:
        if self.audit_file is not None:
            rows = read_audit_rows(self.audit_file)
            uids = [str(row["uid"]) for row in rows]
            splits = sorted({str(row["split"]) for row in rows if row.get("split") is not None})
            where = {p.uid: i for i, p in enumerate(ctx.problems)}
            kept = sorted({where[u] for u in uids if u in where})
            missing = sum(u not in where for u in uids)
            if missing:
                log.warning("prefilter: %d of the %d uids of %s are not in the training pool; ignored",
                            missing, len(uids), self.audit_file)
            self.universe = list(range(self.n_items))
            other = [s for s in splits if s != "train"]
            if not kept:
                why = (f"it exports an audit of the {', '.join(map(repr, other))} split, and training draws from "
                       "the 'train' split" if other else "was the audit run on the training prompts?")
                raise UserError(f"prefilter: no uid of {self.audit_file} is in the training pool "
                                f"({len(uids)} uids read, pool of {self.n_items}): {why}; audit the training "
                                "prompts with rlcurate audit --split train ... and pass that folder's mixed.jsonl")
            if other:
                log.warning("prefilter: %s exports an audit of the %s split; %d of its uids are in the training "
                            "pool", self.audit_file, ", ".join(other), len(kept))
        else:
            self.universe = self._universe()
            kept = sorted(self._audit(ctx, self.universe))
            if not kept:
                if self.fallback == "error":
                    raise UserError(
                        f"prefilter: the audit of {len(self.universe)} prompts x {self.audit_runs} rollouts "
                        "found no mixed prompt; the policy is uniform on this pool (use more audit_runs, an "
                        "easier pool, or fallback='all')")
                log.warning("prefilter: the audit found no mixed prompt; falling back to all %d audited prompts",
                            len(self.universe))
                kept = list(self.universe)
            else:
                log.info("prefilter: the audit kept %d of %d prompts (%d rollouts)", len(kept),
                         len(self.universe), self.audit_rollouts)
        self._set_kept(kept, ctx.step)

    def _reaudit(self, ctx: StepContext) -> None:
        kept = set(self.kept or [])
        dropped = [i for i in self.universe if i not in kept]
        if self.reaudit_fresh is not None and self.reaudit_fresh < len(dropped):
            rng = stream("prefilter_step", self.seed, ctx.step)
            dropped = sorted(int(i) for i in rng.choice(dropped, size=self.reaudit_fresh, replace=False))
        audit = sorted(kept) + dropped
        mixed = self._audit(ctx, audit)
        if not mixed:
            log.warning("prefilter: the re-audit at step %d found no mixed prompt; keeping the previous %d",
                        ctx.step, len(kept))
            self.audited_at = ctx.step
            return
        self._set_kept(sorted(mixed), ctx.step)

    def _set_kept(self, kept: list[int], step: int) -> None:
        self.kept = [int(i) for i in kept]
        self.audited_at = step
        if self.cursor:  # an epoch was under way: start a new one over the new subset
            self.epoch += 1
        self.cursor, self._order = 0, None

    # ------------------------------------------------------------------ selection
    def _epoch_order(self) -> np.ndarray:
        kept = np.asarray(self.kept, dtype=np.int64)
        return kept[stream("prefilter_epoch", self.seed, self.epoch).permutation(kept.size)]

    def draw(self, k: int) -> list[int]:
        if self.kept is None:
            raise RuntimeError("PrefilterSelector.draw before the first select: the audit has not run")
        return super().draw(k)

    def select(self, ctx: StepContext, k: int) -> list[int]:
        if self.kept is None:
            self._initial(ctx)
        elif self.reaudit_every and ctx.step - self.audited_at >= self.reaudit_every:
            self._reaudit(ctx)
        if len(self.kept) < k and not self._warned_small:
            log.warning("prefilter: only %d prompts kept for %d per step; prompts repeat within a step",
                        len(self.kept), k)
            self._warned_small = True
        return self.draw(k)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "kept": self.kept, "universe": self.universe,
                "audited_at": self.audited_at, "audit_rollouts": self.audit_rollouts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.kept = None if state["kept"] is None else [int(i) for i in state["kept"]]
        self.universe = None if state["universe"] is None else [int(i) for i in state["universe"]]
        self.audited_at = int(state["audited_at"])
        self.audit_rollouts = int(state["audit_rollouts"])


@register("prefilter")
@dataclass
class PrefilterConfig(StrategyConfig):
    """Variance prefilter (chapter 6): train only on the prompts an audit of ``audit_runs`` rollouts
    found mixed (from ``audit_file`` or audited in-process at the first step), optionally re-audited
    every ``reaudit_every`` steps. ``group_size`` rollouts per prompt as in uniform GRPO."""

    audit_file: str | None = None
    """JSON lines with the uids to keep (the ``mixed.jsonl`` of ``rlcurate audit --split train``);
    ``None`` audits in-process at the first step."""
    audit_runs: int = 8
    """Rollouts per prompt of an in-process audit or re-audit."""
    audit_prompts: int | None = None
    """Audit only this many prompts drawn at random from the pool (the others are never trained on);
    ``None`` audits the whole pool."""
    reaudit_every: int = 0
    """Re-audit every this many steps with the current policy (0: never)."""
    reaudit_fresh: int | None = None
    """Dropped prompts re-audited along with the kept ones (``None``: all of them)."""
    fallback: str = "error"
    """When an audit finds no mixed prompt: ``"error"`` raises, ``"all"`` trains on every audited
    prompt (with a warning)."""

    def build(self) -> Curator:
        sel = PrefilterSelector(self.audit_file, self.audit_runs, self.audit_prompts, self.reaudit_every,
                                self.reaudit_fresh, self.fallback)
        return Curator(sel, Sampler(), name="prefilter")
