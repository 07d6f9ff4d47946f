"""Not training the rows without signal in TRL's ``GRPOTrainer`` (appendix A2, chapters 10 and 11).

A completion whose advantage is zero on every token (every row of a GRPO group whose rewards are all equal, and
any row at exactly its group's mean) adds nothing to the update when the loss has no KL or entropy term, yet TRL
still runs its forward and backward passes. Chapter 11 measured, in this package's trainer, that this training is
what a filtering sampler saves a dense trainer, and that uniform GRPO which skips those rows gets the same saving or
more; verl 0.9's counterpart is :mod:`rlcurate.interop.verl_skip`.

:class:`ZeroAdvantageSkipping` is a mixin for ``trl.GRPOTrainer`` or any subclass of it (``CuratedGRPOTrainer``
takes it with ``skip_zero_advantage=True``)::

    class Trainer(ZeroAdvantageSkipping, GRPOTrainer):
        pass

    Trainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=ds).train()

Each time TRL has generated, scored, shuffled and split a generation batch into its micro-batches
(``_prepare_inputs``), the rows with signal are packed again into as many micro-batches, fewer rows each
(:func:`pack`): sorted by length, so that each micro-batch also drops the completion columns that are padding on all
its rows, and each kept advantage multiplied by the factor that keeps its loss normaliser (:func:`advantage_scale`).
Rewards, advantages, the rlcurate strategy's observations and TRL's reward metrics are computed before, on every
row; TRL's per-token metrics (entropy, clip ratios) are then means over the kept rows. TRL gathers per-row metrics
across processes, so every process trains as many rows per micro-batch as the one with the most signal needs; the
others fill their places with rows without signal (zero gradient), and the saving shrinks as processes are added
(``rlcurate/skip_rows`` logs what was dropped, over all processes).

Why the update is unchanged. In TRL 1.16's ``_compute_loss`` the per-token loss of a row is positively homogeneous
of degree 1 in its advantage ``A`` for a fixed ratio (a positive factor on ``A`` multiplies it): ``-min(r A, clip(r) A)`` for ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo`` and ``luspo``,
``-clip(r) A log pi`` for ``cispo``, ``-s(r) A`` with ``s`` chosen by the sign of ``A`` for ``sapo``; with
``A = 0`` it is 0 and so is its gradient, so a dropped row enters only through the normaliser, and the
accumulated gradient is a sum over rows, each divided by its micro-batch's normaliser. ``dapo`` and ``cispo`` divide
by the generation batch's loss tokens, counted before the split: factor 1. ``grpo``, ``sapo``, ``dr_grpo`` and
``luspo`` divide by the micro-batch's rows, ``bnpo`` by its loss tokens, so a row moved from a dense micro-batch of
``n`` rows and ``T`` tokens to a packed one of ``m`` rows and ``T'`` tokens has its advantage multiplied by ``m / n``
or ``T' / T``, which gives it its dense weight (the factor is positive, so the clipping and the signs that ``sapo``
and TRL's off-policy mask read are unchanged). Dropping the trailing columns that are padding on every row of a
micro-batch changes nothing that is kept: the model is causal and those columns are masked. ``tests/test_interop_trl_skip.py`` checks the gradient on TRL's own
``_compute_loss`` for every loss type.

Rows are packed only among the micro-batches one optimizer step accumulates (all of a generation batch's when
``gradient_accumulation_steps`` is a multiple of ``steps_per_generation``, each window of
``gradient_accumulation_steps`` when it divides it), so no row changes step. Refused (:func:`inexact_settings`,
before the model loads when ``args`` is passed by keyword, and again once it has loaded), because each makes a
zero-advantage row count or moves rows between steps: the KL term (``beta``), the entropy bonus
(``entropy_coef``, ``use_adaptive_entropy``), ``top_entropy_quantile < 1`` (its token quantile is taken over the
micro-batch), ``vespo`` (its weights are not proportional to ``A``), accumulation windows that neither divide nor
are divided by ``steps_per_generation``; once the model has loaded, a router auxiliary loss (a mixture of experts:
it is taken over every token present) and active dropout (:func:`active_dropout`: its masks depend on the batch's
shape). A generation
batch that carries inputs this module cannot split by rows (images) is trained whole, with one warning and
``rlcurate/skip_inexact``. What is saved: the training forward and backward of the dropped rows and columns, not
the generation, not the forward that computes old log-probabilities (``num_iterations > 1``, vLLM's importance
weights); ``rlcurate/skip_padded_token_share`` logs the share of the padded micro-batch positions removed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

__all__ = ["ZeroAdvantageSkipping", "inexact_settings", "refuse_inexact", "signal_rows", "rows_needed", "pack",
           "advantage_scale", "unknown_inputs", "active_dropout", "SCALE_OF_LOSS", "SkipCount"]

# what each TRL loss type divides the summed per-token loss by, within one micro-batch: "batch" is fixed before the
# split (the generation batch's loss tokens), "rows" the micro-batch's rows, "tokens" its loss tokens
SCALE_OF_LOSS = {"dapo": "batch", "cispo": "batch", "grpo": "rows", "sapo": "rows", "dr_grpo": "rows",
                 "luspo": "rows", "bnpo": "tokens"}
PER_ROW = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
           "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio", "tool_mask")
COMPLETION_WIDTH = ("completion_ids", "completion_mask", "advantages", "old_per_token_logps",
                    "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio", "tool_mask")
SCALARS = ("num_items_in_batch",)


def inexact_settings(args) -> list[str]:
    """The settings of a ``GRPOConfig`` under which dropping zero-advantage rows would change the update, each as
    ``name=value (why)``; empty when it is exact (module docstring)."""
    bad = []
    if getattr(args, "beta", 0.0) != 0.0:
        bad.append(f"beta={args.beta} (the KL term is not zero on a zero-advantage row)")
    if getattr(args, "entropy_coef", 0.0) != 0.0 or getattr(args, "use_adaptive_entropy", False):
        what = "use_adaptive_entropy=True" if args.use_adaptive_entropy else f"entropy_coef={args.entropy_coef}"
        bad.append(f"{what} (the entropy bonus is not zero on a zero-advantage row)")
    if getattr(args, "top_entropy_quantile", 1.0) < 1.0:
        bad.append(f"top_entropy_quantile={args.top_entropy_quantile} (its quantile is taken over the micro-batch's "
                   f"tokens, which the dropped rows change)")
    accumulation, split = getattr(args, "gradient_accumulation_steps", 1), getattr(args, "steps_per_generation", None)
    if split and accumulation % split and split % accumulation:
        bad.append(f"gradient_accumulation_steps={accumulation} with steps_per_generation={split} (one of them must "
                   f"divide the other, so that each optimizer step trains whole groups of micro-batches)")
    loss = getattr(args, "loss_type", "dapo")
    if loss not in SCALE_OF_LOSS:
        bad.append(f"loss_type={loss!r} (its weights are not linear in the advantage; supported: "
                   f"{', '.join(SCALE_OF_LOSS)})")
    return bad


def refuse_inexact(args, what: str = "skip_zero_advantage") -> None:
    """One ``ValueError`` line naming every setting of ``args`` under which ``what`` would change the update."""
    bad = inexact_settings(args)
    if bad:
        raise ValueError(f"{what} leaves TRL's update unchanged only without these settings: {'; '.join(bad)}")


def _loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if batch.get("tool_mask") is not None else mask


def advantage_scale(loss_type: str, rows: int, new_rows: int, tokens: float, new_tokens: float) -> float:
    """The factor on a kept row's advantage that keeps ``loss_type``'s normaliser at its dense micro-batch's, when
    the row is trained in a micro-batch of ``new_rows`` rows and ``new_tokens`` loss tokens instead of its dense
    one's ``rows`` and ``tokens``: 1 for a normaliser fixed before the split, ``new_rows / rows`` for a mean over
    rows, ``new_tokens / tokens`` for a mean over loss tokens (1 where either has none: the row's loss is 0)."""
    scale = SCALE_OF_LOSS[loss_type]
    if scale == "rows":
        return new_rows / rows
    if scale == "tokens" and tokens > 0 and new_tokens > 0:
        return new_tokens / tokens
    return 1.0


@dataclass
class SkipCount:
    """What one generation batch lost on one process: rows, loss tokens and padded positions (prompt plus
    completion width, per row)."""
    rows: int = 0
    dropped_rows: int = 0
    loss_tokens: float = 0.0
    dropped_loss_tokens: float = 0.0
    positions: int = 0
    dropped_positions: int = 0

    def as_list(self) -> list:
        return [self.rows, self.dropped_rows, self.loss_tokens, self.dropped_loss_tokens, self.positions,
                self.dropped_positions]


def unknown_inputs(batch: dict) -> list[str]:
    """The keys of a TRL micro-batch this module cannot split by rows (images and their grids)."""
    return sorted(k for k, v in batch.items() if v is not None and k not in PER_ROW + SCALARS)


def signal_rows(batch: dict) -> torch.Tensor:
    """Per row of a TRL micro-batch: whether its advantage is non-zero on some token and its loss mask has one."""
    adv = batch["advantages"]
    flat_adv = adv if adv.dim() == 1 else adv.reshape(adv.shape[0], -1).abs().amax(dim=1)
    return (flat_adv != 0) & (_loss_mask(batch).sum(dim=1) > 0)


def rows_needed(batches: list[dict]) -> int:
    """Rows per micro-batch that :func:`pack` needs to train every row with signal of ``batches`` (at least 1)."""
    signal = sum(int(signal_rows(b).sum()) for b in batches)
    return max(1, -(-signal // len(batches)))


def pack(batches: list[dict], loss_type: str, rows_per_batch: int | None = None) -> tuple[list[dict], SkipCount]:
    """TRL's micro-batches of one generation batch (on one process) packed again without their rows that carry no
    signal (:func:`signal_rows`): as many micro-batches, each of ``rows_per_batch`` rows (default
    :func:`rows_needed`; on several processes the most any process needs, as TRL gathers per-row metrics across
    them), the rows sorted by the positions they attend to so that each micro-batch drops the completion columns
    that are padding on all its rows, every kept advantage multiplied by :func:`advantage_scale` from its dense
    micro-batch to its new one. Where there are fewer rows with signal than places, the rows without it that attend
    to the fewest positions fill them (their gradient is zero). Raises ``KeyError`` naming the inputs it cannot
    split by rows (the caller trains such a generation batch whole)."""
    unknown = sorted({k for b in batches for k in unknown_inputs(b)})
    if unknown:
        raise KeyError(", ".join(unknown))
    n, width, prompt_width = len(batches[0]["advantages"]), batches[0]["completion_ids"].shape[1], \
        batches[0]["prompt_ids"].shape[1]
    if any(len(b["advantages"]) != n or b["completion_ids"].shape[1] != width for b in batches):
        raise ValueError("TRL's micro-batches of one generation batch differ in rows or width")
    per_row = [k for k in batches[0] if batches[0][k] is not None and k not in SCALARS]
    whole = {k: torch.cat([b[k] for b in batches]) for k in per_row}
    masks = [_loss_mask(b) for b in batches]
    dense_tokens = torch.cat([torch.full((n,), float(m.sum())) for m in masks])
    signal = torch.cat([signal_rows(b) for b in batches]).cpu()  # read row by row below: one transfer
    attended = (whole["prompt_mask"].sum(dim=1) + whole["completion_mask"].sum(dim=1)).cpu()
    places = len(batches) * min(rows_per_batch or rows_needed(batches), n)
    chosen = signal.nonzero(as_tuple=True)[0].tolist()
    if len(chosen) > places:
        raise ValueError(f"rows_per_batch={rows_per_batch} leaves no place for {len(chosen) - places} rows with signal")
    cheapest = [i for i in torch.argsort(attended, stable=True).tolist() if not signal[i]]
    chosen += cheapest[:places - len(chosen)]
    chosen.sort(key=lambda i: -int(attended[i]))
    size = places // len(batches)
    mask = torch.cat(masks)
    out = []
    for j in range(len(batches)):
        rows = torch.tensor(sorted(chosen[j * size:(j + 1) * size]))
        columns = whole["completion_mask"][rows].sum(dim=0).nonzero()
        new_width = int(columns.max()) + 1 if len(columns) else 1
        new_tokens = float(mask[rows].sum())
        factor = [advantage_scale(loss_type, n, size, float(dense_tokens[i]), new_tokens) for i in rows.tolist()]
        micro = {k: v for k, v in batches[0].items() if v is None or k in SCALARS}
        for key in per_row:
            value = whole[key][rows]
            if key in COMPLETION_WIDTH and value.dim() == 2 and value.shape[1] == width:
                value = value[:, :new_width]
            if key == "advantages":
                scale = torch.tensor(factor, dtype=value.dtype, device=value.device)
                value = value * scale.reshape(-1, *([1] * (value.dim() - 1)))
            micro[key] = value
        out.append(micro)
    total_rows = len(batches) * n
    kept_positions = sum(len(b["advantages"]) * (prompt_width + b["completion_ids"].shape[1]) for b in out)
    tokens = float(mask.sum())
    count = SkipCount(rows=total_rows, dropped_rows=total_rows - places, loss_tokens=tokens,
                      dropped_loss_tokens=tokens - float(mask[chosen].sum()),
                      positions=total_rows * (prompt_width + width),
                      dropped_positions=total_rows * (prompt_width + width) - kept_positions)
    return out, count


def active_dropout(model) -> list[str]:
    """The dropout in ``model`` that is active in training: ``nn.Dropout`` modules with p > 0 and modules whose
    ``attention_dropout`` (passed to the attention kernel by Qwen2, Llama and others) is above 0, by name."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            found.append(f"{name or 'model'} (p={module.p})")
        rate = getattr(module, "attention_dropout", 0.0)
        if isinstance(rate, float) and rate > 0:
            found.append(f"{name or 'model'}.attention_dropout={rate}")
    return found


class ZeroAdvantageSkipping:
    """Mixin for ``trl.GRPOTrainer``: trains each generation batch without its rows that carry no signal, packed
    into its micro-batches (:func:`pack`), the update unchanged (module docstring). ``skip_zero_advantage=False``
    turns it off. Logs, per generation batch and over all processes, ``rlcurate/skip_rows`` (share of rows dropped),
    ``rlcurate/skip_loss_token_share`` (share of loss tokens in them), ``rlcurate/skip_padded_token_share`` (share
    of the padded micro-batch positions removed) and ``rlcurate/skip_inexact`` (processes that trained the
    generation batch whole)."""

    def __init__(self, *args, skip_zero_advantage: bool = True, **kwargs):
        if not isinstance(skip_zero_advantage, bool):
            raise ValueError(f"skip_zero_advantage={skip_zero_advantage!r}: expected True or False")
        self.skip_zero_advantage = skip_zero_advantage
        if skip_zero_advantage and kwargs.get("args") is not None:  # before the model loads (TRL's default is exact)
            refuse_inexact(kwargs["args"])
        self._skip_warned = False
        super().__init__(*args, **kwargs)
        if not skip_zero_advantage:
            return
        refuse_inexact(self.args)  # GRPOConfig passed by position
        if getattr(self, "aux_loss_enabled", False):
            raise ValueError("skip_zero_advantage leaves TRL's update unchanged only without a router auxiliary loss "
                             "(the model is a mixture of experts: set router_aux_loss_coef=0.0 or leave "
                             "skip_zero_advantage off)")
        dropout = active_dropout(self.model)
        if dropout:
            raise ValueError(f"skip_zero_advantage leaves TRL's update unchanged only without dropout (its masks "
                             f"depend on the batch's shape): {', '.join(dropout[:3])}"
                             f"{f' and {len(dropout) - 3} more' if len(dropout) > 3 else ''}; set "
                             f"disable_dropout=True in GRPOConfig (nn.Dropout) and attention_dropout=0 in the model's "
                             f"config")

    def _prepare_inputs(self, generation_batch):
        buffered = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if not self.skip_zero_advantage or not self.model.training or self._buffered_inputs is buffered:
            return inputs  # evaluation, or a micro-batch of a generation batch already treated
        batches = self._buffered_inputs
        unknown = sorted({k for b in batches for k in unknown_inputs(b)})
        if unknown and not self._skip_warned:
            warnings.warn(f"skip_zero_advantage: a micro-batch carries inputs it cannot split by rows "
                          f"({', '.join(unknown)}); such generation batches are trained whole (rlcurate/skip_inexact)",
                          stacklevel=2)
            self._skip_warned = True
        # micro-batches that one optimizer step accumulates are packed together (inexact_settings refuses the
        # accumulation windows that cut a generation batch unevenly); every process trains as many rows per
        # micro-batch of a window as the process that needs the most
        window = min(self.args.gradient_accumulation_steps, len(batches))
        windows = [batches[i:i + window] for i in range(0, len(batches), window)]
        need = [len(batches[0]["advantages"]) if unknown else rows_needed(w) for w in windows]
        device = self.accelerator.device
        most = self.accelerator.gather(torch.tensor(need, device=device)).reshape(-1, len(windows)).amax(dim=0)
        if unknown:
            treated = batches
            total = SkipCount(rows=sum(len(b["advantages"]) for b in batches),
                              loss_tokens=float(sum(_loss_mask(b).sum() for b in batches)),
                              positions=sum(b["prompt_ids"].numel() + b["completion_ids"].numel() for b in batches))
        else:
            treated, counts = [], []
            for w, rows in zip(windows, most.tolist()):
                packed, count = pack(w, self.loss_type, rows_per_batch=rows)
                treated += packed
                counts.append(count.as_list())
            total = SkipCount(*(sum(c[k] for c in counts) for k in range(len(counts[0]))))
        inexact = int(bool(unknown))
        self._buffered_inputs = treated
        sums = self.accelerator.reduce(torch.tensor(total.as_list() + [inexact], dtype=torch.float64, device=device),
                                       reduction="sum").tolist()
        rows, dropped, tokens, dropped_tokens, positions, dropped_positions, inexact = sums
        metrics = self._metrics["train"]
        metrics["rlcurate/skip_rows"].append(dropped / max(rows, 1.0))
        metrics["rlcurate/skip_loss_token_share"].append(dropped_tokens / max(tokens, 1.0))
        metrics["rlcurate/skip_padded_token_share"].append(dropped_positions / max(positions, 1.0))
        metrics["rlcurate/skip_inexact"].append(inexact)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]
