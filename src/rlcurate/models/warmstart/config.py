"""The configuration of a warm-start run and the stages it saves (chapter 4, *The variance audit*).

The fields of :class:`WarmStartConfig` are the options of ``rlcurate warmstart``
(:mod:`rlcurate.models.warmstart.cli`, built from their docstrings by :mod:`rlcurate.config_cli`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlcurate.tasks.arithmetic import TINY_LEVELS, ArithmeticTask

__all__ = ["MAX_MIXED", "TINY_LEVEL_WEIGHTS", "WarmStartConfig", "parse_save_at"]

# Sampling weights of TINY_LEVELS in the warm-start: fewer easy, more long problems, so that the levels
# reach mixed pass rates at about the same time.
TINY_LEVEL_WEIGHTS = (0.5, 0.75, 1.0, 0.75, 1.0, 1.25, 1.25, 1.5, 1.0)


@dataclass
class WarmStartConfig:
    """Hyper-parameters of a warm-start run (chapter 4). Defaults are the ones used for ``data/tiny``."""

    steps: int = 2500
    """Optimizer steps."""
    seed: int = 0
    """Seeds the initial weights, the training stream and the evaluation samples."""
    levels: tuple[str, ...] = TINY_LEVELS
    """Arithmetic levels trained on (and evaluated on), e.g. ``("add2", "mul2x1")``."""
    level_weights: tuple[float, ...] | None = None
    """Relative sampling weight of each level. None: :data:`TINY_LEVEL_WEIGHTS` when ``levels`` are
    the default :data:`~rlcurate.tasks.arithmetic.TINY_LEVELS`, uniform otherwise."""
    scratchpad: bool = True
    """Train on scratchpad completions (reasoning steps before ``#answer``) or on ``#answer`` only."""
    hint_share: float = 0.0
    """Share of training prompts that carry a hint of level 1-3 (drawn uniformly). Not needed with
    the tiny style's assistant-side hints: every reference completion already teaches the model to
    continue from each prefix of its steps. User-turn hints (``hint_placement="user"``) are SAGE's
    answer-free ones (:meth:`~rlcurate.tasks.arithmetic.ArithmeticTask.placed_hint`); at share 0.5 the
    model learns to use them (``data/tiny/spread_user``, chapter 7)."""
    hint_placement: str | None = None
    """Where hints go (:class:`~rlcurate.tasks.arithmetic.ArithmeticTask`): None for the task's default
    (``"assistant"`` with the scratchpad), or ``"assistant"`` / ``"user"``."""
    hint_eval: bool = True
    """At each saved stage, also measure held-out pass rates with hints of level 1-3 (chapter 7)."""
    batch_size: int = 64
    """Sequences per optimizer step."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    warmup_steps: int = 100
    """Linear warm-up from 0 to ``lr``."""
    schedule: str = "constant"
    """``"constant"`` after warm-up (a stage saved at step k equals a run of k steps) or ``"cosine"``
    (decay to ``min_lr_ratio * lr`` at ``steps``)."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine schedule as a share of ``lr``."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    model: dict = field(default_factory=dict)
    """Overrides of the tiny Qwen2 config (``rlcurate.models.tiny.TINY_CONFIG``)."""
    eval_every: int = 500
    """Evaluate on held-out prompts every this many steps (0: only at saved stages and the end)."""
    eval_per_level: int = 32
    """Held-out prompts per level in each evaluation."""
    eval_samples: int = 8
    """Samples per held-out prompt."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluation (top-k and top-p are off)."""
    log_every: int = 50
    """Write the mean training loss every this many steps."""
    threads: int = 2
    """torch CPU threads."""

    def __post_init__(self):
        self.levels = tuple(self.levels)
        self.betas = tuple(self.betas)
        if self.level_weights is None and self.levels == TINY_LEVELS:
            self.level_weights = TINY_LEVEL_WEIGHTS
        if self.level_weights is not None:
            self.level_weights = tuple(float(w) for w in self.level_weights)

    def validate(self) -> "WarmStartConfig":
        """Raise ``ValueError`` naming the first bad field; return self."""
        for name in ("steps", "batch_size", "eval_samples", "log_every", "threads", "eval_per_level"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("seed", "warmup_steps", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not 0.0 <= self.hint_share <= 1.0:
            raise ValueError(f"hint_share must lie in [0, 1], got {self.hint_share!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio!r}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip!r}")
        if not self.eval_temperature > 0:
            raise ValueError(f"eval_temperature must be > 0, got {self.eval_temperature!r}")
        if self.level_weights is not None:
            w = np.asarray(self.level_weights, dtype=float)
            if w.shape != (len(self.levels),) or (w < 0).any() or w.sum() <= 0:
                raise ValueError(
                    f"level_weights must be {len(self.levels)} non-negative numbers with a positive sum, "
                    f"got {self.level_weights!r}"
                )
        ArithmeticTask(self.levels, scratchpad=self.scratchpad, hint_placement=self.hint_placement)  # validates them
        return self

    def task(self, n_test: int | None = None) -> ArithmeticTask:
        """The tiny-style :class:`ArithmeticTask` this run trains on; its test split is held out."""
        return ArithmeticTask(
            self.levels, style="tiny", scratchpad=self.scratchpad, hint_placement=self.hint_placement,
            n_test=self.eval_per_level if n_test is None else n_test,
        )


MAX_MIXED = "max-mixed"


def parse_save_at(spec: str | None, steps: int) -> dict:
    """The stages of a warm-start run to save (chapter 4): ``"early=500,spread=max-mixed,saturated=2500"``
    or ``"500,2500"`` (names ``step500``...) as ``{step: name}``. The step ``max-mixed`` (at most one)
    picks, after the run, the evaluated step with the largest share of mixed held-out prompts."""
    if not spec:
        return {}
    out: dict = {}
    for item in spec.split(","):
        item = item.strip()
        name, _, step_text = item.rpartition("=")
        if step_text == MAX_MIXED:
            step = MAX_MIXED
            if not name:
                raise ValueError(f"save_at item {item!r} needs a name: NAME={MAX_MIXED}")
        else:
            try:
                step = int(step_text)
            except ValueError:
                raise ValueError(f"save_at items must be STEP, NAME=STEP or NAME={MAX_MIXED}, got {item!r}") from None
            if not 1 <= step <= steps:
                raise ValueError(f"save_at step must lie in 1..{steps}, got {item!r}")
        name = name or f"step{step}"
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"save_at names must be plain words, got {item!r}")
        if step in out:
            raise ValueError(f"save_at names step {step} twice: {spec!r}")
        if name in out.values():
            raise ValueError(f"save_at uses the name {name!r} twice: {spec!r}")
        out[step] = name
    return out
