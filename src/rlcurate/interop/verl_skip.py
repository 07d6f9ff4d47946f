"""Not training the groups without signal in verl's v1 trainer (appendix A2, chapters 10 and 11).

A GRPO group whose responses all got the same reward has a zero advantage on every token. With a group-mean
baseline, no KL or entropy term and one optimizer step per batch, such a row adds nothing to the update, yet a
dense trainer such as verl still runs its old-log-probability, forward and backward passes. Chapter 11 measured,
in this package's trainer, that this training is what a filtering sampler saves a dense trainer, and that uniform
GRPO which skips those groups gets the same saving or more (``rlcurate advise --training dense`` prints the share
from an audit); in verl the saving is smaller by its padding rows (below) and has not been measured.

This module is the plan, free of verl: which rows to drop (:func:`plan_skip`), the factor that keeps the loss's
normaliser (:func:`advantage_scale`) and the settings under which the update is the dense trainer's
(:func:`inexact_settings`). :class:`rlcurate.interop.verl_v1.CuratedPPOTrainer` applies it with
``+data.sampler.skip_zero_advantage=true``: it drops the rows before verl's ``_balance_batch`` (which pads the
batch back to whole mini-batches with 128-token rows whose loss mask is 0; they go through every pass, so a
dropped row saves its length less 128 tokens), multiplies the kept advantages by the factor after
``_compute_advantage``, lets the sampler observe the dropped groups too, and clears them from TransferQueue.

Why the update is unchanged, for the loss modes verl's engine workers use (``verl.trainer.ppo.core_algos.agg_loss``
with the global batch information the engine passes): the dropped rows' per-token loss is ``-A x ratio`` clipped,
zero with ``A = 0``, so they enter only through the normaliser. ``token-mean`` divides by the mini-batch's loss
tokens, which fall from :math:`T_\\text{dense}` to :math:`T_\\text{kept}`; the clipped loss of vanilla PPO and of
GSPO is positively homogeneous in ``A``, so multiplying the kept advantages by
:math:`T_\\text{kept} / T_\\text{dense}` restores the dense gradient exactly. ``token-sum`` has no divisor and the
``seq-mean-*`` modes divide by the nominal ``ppo_mini_batch_size x n``, so their factor is 1
(``seq-mean-token-sum-norm`` needs a fixed ``loss_scale_factor``: by default it divides by the padded width,
which depends on the rows present). ``tests/test_interop_verl_current.py`` checks the gradient on verl's own
loss functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SKIP_KEY = "skip_zero_advantage"  # under data.sampler
EXACT_LOSS_MODES = ("vanilla", "gspo")  # positively homogeneous in the advantage, each row on its own
SCALED_AGG_MODES = ("token-mean",)  # the normaliser counts the tokens present


def _get(cfg, dotted: str, default=None):
    for key in dotted.split("."):
        if cfg is None:
            return default
        cfg = cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return default if cfg is None else cfg


def skip_requested(config) -> bool:
    """Whether ``data.sampler.skip_zero_advantage`` is set in verl's ``config``."""
    value = _get(config, f"data.sampler.{SKIP_KEY}", False)
    if not isinstance(value, bool):
        raise ValueError(f"data.sampler.{SKIP_KEY}={value!r}: expected true or false")
    return value


def inexact_settings(config) -> list[str]:
    """The settings of verl's ``config`` under which dropping zero-advantage groups would change the update,
    each as ``key=value (why)``; empty when it is exact (module docstring)."""
    actor = "actor_rollout_ref.actor"
    sync_step = int(_get(config, "trainer.v1.sync.parameter_sync_step", 1))  # the registered trainer runs as sync
    per_update = int(_get(config, "data.train_batch_size")) // sync_step
    problems = []
    checks = (
        ("algorithm.adv_estimator", lambda v: v == "grpo", "only GRPO's group baseline makes a flat group's advantage 0 "
                                                           "in verl's v1 advantage code"),
        ("algorithm.use_kl_in_reward", lambda v: not v, "a KL penalty in the reward makes a group's values differ"),
        (f"{actor}.use_kl_loss", lambda v: not v, "the KL loss has a gradient on every row"),
        (f"{actor}.entropy_coeff", lambda v: float(v) == 0, "the entropy bonus has a gradient on every row"),
        (f"{actor}.ppo_epochs", lambda v: int(v) == 1, "one optimizer step per batch: fewer rows would change "
                                                       "the mini-batches"),
        (f"{actor}.ppo_mini_batch_size", lambda v: int(v) == per_update,
         f"one optimizer step per batch needs it equal to data.train_batch_size / "
         f"trainer.v1.sync.parameter_sync_step = {per_update}"),
        (f"{actor}.policy_loss.loss_mode", lambda v: v in EXACT_LOSS_MODES,
         f"exact for {' and '.join(EXACT_LOSS_MODES)}, whose loss is each row's and scales with the advantage"),
        ("algorithm.rollout_correction.rollout_rs", lambda v: v is None, "rejection sampling changes the loss mask"),
        ("algorithm.rollout_correction.rollout_is_batch_normalize", lambda v: not v,
         "the weights are normalised over the rows present"),
        ("distillation.enabled", lambda v: not v, "the distillation loss has a gradient on every row"),
        ("critic.enable", lambda v: not v, "the critic would train on the rows kept"),
        (f"{actor}.strategy", lambda v: v != "megatron", "not checked on Megatron, where a mixture-of-experts "
                                                        "model's router loss has a gradient on every token present"),
    )
    for key, ok, why in checks:
        value = _get(config, key, None)
        if value is not None and not ok(value):
            problems.append(f"{key}={value} ({why})")
    if (_get(config, f"{actor}.loss_agg_mode", "token-mean") == "seq-mean-token-sum-norm"
            and _get(config, f"{actor}.loss_scale_factor", None) is None):
        problems.append(f"{actor}.loss_agg_mode=seq-mean-token-sum-norm without {actor}.loss_scale_factor (it then "
                        "divides by the padded width, which depends on the rows present; set a fixed factor)")
    return problems


def refuse_inexact(config, name: str) -> None:
    """Refuse (``ValueError``, one line) ``skip_zero_advantage`` where it would change the update."""
    problems = inexact_settings(config)
    if problems:
        raise ValueError(f"{name}: data.sampler.{SKIP_KEY}=true leaves verl's update unchanged only with a group "
                         f"baseline, no KL or entropy term and one optimizer step per batch; here: "
                         + "; ".join(problems))


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


@dataclass
class SkipPlan:
    """Which rows of one batch to train (``keep``) and which to drop (``drop``), by position."""

    keep: list[int]
    drop: list[int]
    flat_groups: list[str] = field(default_factory=list)  # uids to whose responses verl gives a zero advantage
    tokens_kept: int = 0  # loss tokens of the rows kept, padding excluded
    tokens_dense: int = 0  # loss tokens of every row
    inexact: bool = False  # the dense batch is longer than one mini-batch: nothing is dropped

    def metrics(self, prefix: str = "rlcurate/skip_") -> dict[str, float]:
        """Per update: groups and rows dropped, the share of loss tokens not trained, and 1 where the batch was
        too long to skip exactly."""
        return {f"{prefix}groups": len(self.flat_groups), f"{prefix}rows": len(self.drop),
                f"{prefix}loss_token_share": 1 - self.tokens_kept / self.tokens_dense if self.tokens_dense else 0.0,
                f"{prefix}inexact": float(self.inexact)}


def zero_advantage_in_verl(scores) -> bool:
    """Whether verl's GRPO gives every response of a group an advantage of exactly 0: more than one score (a lone
    response gets its score as advantage), all equal, and their float32 mean equal to them
    (``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` averages in float32, with or without the
    standard deviation). Equal scores whose mean rounds, such as six of 0.3 (mean 0.3 - 3e-8), get an advantage of
    about 0.03 from verl: such a group is trained by the dense trainer, so it is kept."""
    if len(scores) < 2 or max(scores) != min(scores):
        return False
    values = torch.tensor(list(scores), dtype=torch.float32)
    return bool(torch.mean(values) == values[0])


def plan_skip(keys, tags, scores, loss_tokens, mini_batch_rows: int | None = None) -> SkipPlan:
    """The rows to drop from one batch: every row of a group (a uid, the first part of each key) to whose sessions'
    final outputs verl's GRPO gives a zero advantage (:func:`zero_advantage_in_verl`), and verl's padding rows (it
    pads the batch again). ``scores``: each row's summed ``rm_scores``; ``loss_tokens``: its response-mask sum.

    ``mini_batch_rows`` (``ppo_mini_batch_size x rollout.n``): when the batch holds more real rows than that (sessions
    with several outputs, or a prompt given more than ``rollout.n`` responses), the dense trainer takes several
    optimizer steps on it and fewer rows would take fewer, so nothing is dropped and the plan says ``inexact``.

    When every group is flat, the group with the fewest loss tokens is kept: its zero gradient gives the same
    optimizer step as the dense batch (Adam still moves on its moments) at the least cost."""
    finals: dict[str, list[float]] = {}
    for row in trained_responses(keys, tags):
        finals.setdefault(keys[row].rsplit("_", 2)[0], []).append(float(scores[row]))
    real = [r for r, tag in enumerate(tags) if not tag.get("is_padding", False)]
    if not finals or mini_batch_rows is not None and len(real) > mini_batch_rows:  # padding alone, or too long
        return SkipPlan(keep=list(range(len(keys))), drop=[], inexact=bool(finals))
    flat = {uid for uid, s in finals.items() if zero_advantage_in_verl(s)}
    padding = {row for row, tag in enumerate(tags) if tag.get("is_padding", False)}
    uid_of = [key.rsplit("_", 2)[0] for key in keys]
    if flat and flat == set(finals):  # nothing has signal: keep the cheapest group
        tokens = {uid: sum(int(loss_tokens[r]) for r in range(len(keys)) if uid_of[r] == uid and r not in padding)
                  for uid in flat}
        flat = flat - {min(sorted(flat), key=tokens.get)}
    drop = [r for r in range(len(keys)) if r in padding or uid_of[r] in flat]
    dropped = set(drop)
    keep = [r for r in range(len(keys)) if r not in dropped]
    dense = sum(int(loss_tokens[r]) for r in range(len(keys)) if r not in padding)
    kept = sum(int(loss_tokens[r]) for r in keep)
    return SkipPlan(keep=keep, drop=drop, flat_groups=sorted(flat), tokens_kept=kept, tokens_dense=dense)


def advantage_scale(plan: SkipPlan, loss_agg_mode: str) -> float:
    """The factor on the kept rows' advantages that keeps verl's loss normaliser: :math:`T_\\text{kept} /
    T_\\text{dense}` under ``token-mean``, 1 for the modes that divide by nothing or by the nominal row count."""
    if loss_agg_mode in SCALED_AGG_MODES and plan.tokens_dense and plan.tokens_kept != plan.tokens_dense:
        return plan.tokens_kept / plan.tokens_dense
    return 1.0
