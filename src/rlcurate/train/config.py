"""The training configuration (chapter 5, *The GRPO loop*).

One dataclass holds every knob of a run. Each field is documented by the string right below it; the
same text is the ``--help`` of ``rlcurate train`` and appears in the saved ``config.json``. A run is
described by a YAML file (``configs/NAME.yaml``) whose keys are field names, plus command-line
overrides ``--set key=value`` (values parsed as YAML, so ``--set strategy_kwargs={k_pos: 2}`` works).

Every bad value raises :class:`~rlcurate.errors.UserError` naming the key (and the file), so the
command line prints one line; the checks that need the strategy, task, model or run folder are in
:mod:`rlcurate.train.preflight`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlcurate.errors import UserError
from rlcurate.rollout.base import DECODE_MODES


@dataclass
class TrainConfig:
    # ---------------------------------------------------------------- what to train
    model: str = "data/tiny/spread"
    """Policy to start from: a local checkpoint directory, a Hugging Face Hub id such as
    ``Qwen/Qwen2.5-0.5B-Instruct``, or ``smollm2`` for the offline SmolLM2-135M-Instruct."""
    task: str = "arithmetic"
    """Prompt source and verifier (:func:`rlcurate.tasks.available_tasks`: ``arithmetic``, ``gsm8k``, ``math``,
    ``math500``, ``math_l3to5``, ``countdown``)."""
    task_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the task, e.g. ``{levels: [add2, add3], n_train: 2000}`` for arithmetic."""
    strategy: str = "uniform"
    """Curation strategy (chapters 6-11; :func:`rlcurate.curation.registry.available` lists them, ``rlcurate
    strategies`` describes them); combine a selector with a sampler as ``insight+ada_seq_balanced``."""
    strategy_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the strategy (its paper's defaults otherwise)."""
    seed: int = 0
    """Seeds selection, sampling and initialisation; the same seed gives the same run on CPU."""
    order_offset: int = 0
    """The curator's own streams (the order of the passes over the pool, a prefilter's draws) are seeded
    with ``seed + order_offset``. Two uniform runs that differ only here are chapter 10's A/A control:
    the same sampling and evaluation streams, an independent prompt order for every seed."""

    # ---------------------------------------------------------------- batch and rollouts
    steps: int = 100
    """Optimizer steps (one batch of prompts each, unless ``update_epochs`` or ``minibatches`` > 1)."""
    max_rollouts: int = 0
    """Stop once this many rollouts were generated in total (0: no limit); with ``steps`` as an upper
    bound, this compares strategies at equal sampling compute (chapter 10)."""
    prompts_per_step: int = 16
    """B: prompts trained on per step."""
    group_size: int = 8
    """n (G): rollouts per prompt in a training group."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (the training log-probabilities use the same)."""
    top_p: float = 1.0
    """Nucleus sampling of the rollouts (1.0: the whole vocabulary)."""
    max_new_tokens: int = 32
    """Longest completion in tokens."""
    gen_token_budget: int = 16384
    """Tokens (prompt + completion) per generation batch: bounds memory of the rollout engine."""
    decode: str = "dynamic"
    """How the rollout engine decodes (appendix A1; :class:`rlcurate.rollout.TransformersEngine`):
    ``dynamic`` (a KV cache that grows by one column a step), ``static`` (one persistent cache, every step
    of the same shapes, batches in buckets of rows), ``captured`` (static, each bucket's whole step
    recorded once as a CUDA graph and replayed: on a GPU, where eager decoding is launch-bound) or
    ``compiled`` (captured, the step's forward compiled with ``torch.compile`` first). All sample the same
    tokens (tests/test_rollout_static.py). The fixed-shape cache is held for the whole run, training
    included: ``rlcurate plan`` counts it. On H200 machines (one run each, two sessions) the trainer's
    generation took 4.2 s captured against 14.5 s dynamic (data/bench/dryrun_h200_grpo_05b_decode.json)."""
    report_to: Any = "none"
    """Where the metrics also stream (appendix A1): ``none``, ``tensorboard`` (``out_dir/tensorboard``),
    ``wandb`` (offline unless ``WANDB_MODE`` says otherwise; ``out_dir/wandb``), or a list of both; through the
    libraries themselves (``pip install 'rlcurate[watch]'``). A resumed run continues the same curves."""
    rollout_weights: str = "train"
    """The weights rollouts are sampled with: ``train`` (the trained model itself, under autocast on a GPU)
    or ``bf16`` (a bf16 copy of its parameters, refreshed before every generation: half the bytes read per
    decode step; the planner charges its 2 bytes a parameter). Appendix A1."""
    train_subset: str = ""
    """A JSON-lines file whose lines name training prompts by ``uid`` (a filtered export of
    ``rlcurate audit --split train``): training draws from those prompts only, the data preparation
    of Reinforce-Ada (chapter 10's filtered-pool condition). Empty: the whole training split."""
    max_prompt_tokens: int = 4096
    """Prompts (chat template included) longer than this many tokens are left out of training and
    evaluation, with a count in the log and in ``summary.json`` (0: no limit)."""

    # ---------------------------------------------------------------- the loss
    advantage: str = "grpo"
    """``grpo`` (r - mean)/(std + eps); ``drgrpo`` r - mean (or r - p_hat of a strategy's pool);
    ``rloo`` leave-one-out. Not offered: TRL's ``scale_rewards="batch"`` (one std over the whole batch),
    because the strategies reason about one prompt's group or pool at a time (Reinforce-Ada's p_hat is
    not on the scale of a batch std); with TRL's own trainer (appendix A2) its setting still applies."""
    adv_eps: float = 1e-6
    """eps of the standardised advantage."""
    loss_agg: str = "token-mean"
    """``token-mean`` (DAPO: all tokens of the batch weigh the same), ``seq-mean-token-mean`` (GRPO:
    mean over a sequence, then over sequences), ``seq-mean-token-sum-norm`` (Dr. GRPO: token sums
    divided by ``max_new_tokens``, then the mean over sequences)."""
    clip_low: float = 0.2
    """PPO clip below: the ratio is kept above 1 - clip_low for negative-advantage tokens."""
    clip_high: float = 0.28
    """PPO clip above (DAPO's clip-higher): the ratio is kept below 1 + clip_high."""
    kl_coef: float = 0.0
    """Weight of the k3 estimate of KL(pi || pi_ref) in the loss; 0 disables the reference model."""
    clip_ratio_c: float = 3.0
    """Dual clip (verl's ``clip_ratio_c``, default 3; Reinforce-Ada's script sets 10): the loss of a
    negative-advantage token is at most -A * clip_ratio_c however large its ratio. 0 disables it;
    otherwise it must exceed 1."""
    log_ratio_clamp: float = 20.0
    """log pi - log pi_old, and log pi_ref - log pi in the k3 term, are clamped to +-this before the
    exponential (verl: 20). 0 disables."""
    kl_clamp: float = 10.0
    """Upper clamp of the k3 term per token (verl's ``low_var_kl`` clamps to [-10, 10]). 0 disables."""
    update_epochs: int = 1
    """Passes over each batch (PPO epochs); > 1 uses the stored old log-probabilities."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""
    micro_batch_tokens: int = 16384
    """Tokens per forward/backward micro-batch (gradient accumulation); bounds training memory
    (``rlcurate plan`` predicts the peak, appendix A1)."""
    micro_batch_memory_gib: float = 0.0
    """If > 0, micro-batches hold the most tokens whose activations fit in this many GiB, counted from
    the model's architecture when training starts (:mod:`rlcurate.policy.memory`, within 3 % of an
    H100's measurement), in place of ``micro_batch_tokens``; 0: ``micro_batch_tokens`` as given."""
    gradient_checkpointing: bool = False
    """Recompute each transformer layer's activations in the backward pass instead of keeping them
    (about a third more compute, a fraction of the activation memory); the G completions of a prompt
    are then encoded with the prompt each (no shared prompt cache, chapter 5)."""

    # ---------------------------------------------------------------- the optimizer
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple = (0.9, 0.99)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up."""
    lr_schedule: str = "constant"
    """``constant`` or ``cosine`` (to 10% of ``lr``) after the warm-up."""
    grad_clip: float = 1.0
    """Clip the global gradient norm (0 disables)."""

    # ---------------------------------------------------------------- evaluation and logging
    eval_every: int = 10
    """Held-out evaluation every this many steps (and at the start and the end); 0 disables."""
    eval_every_rollouts: int = 0
    """Held-out evaluation each time the generated rollouts cross a multiple of this number (and at
    the start and the end), so that runs of strategies with different steps are read at the same
    compute (chapter 10); the record's ``eval/grid`` is the multiple crossed. 0 disables."""
    eval_split: str = "test"
    """The split evaluated: ``test``, or ``validation`` for choosing a learning rate without looking at
    the test prompts (a task that has one, e.g. arithmetic with ``validation_fraction``)."""
    eval_prompts: int = 128
    """Held-out prompts per evaluation (the first ones of the test split)."""
    eval_samples: int = 4
    """Samples per held-out prompt; accuracy is their mean reward (mean@k at ``temperature``)."""
    eval_temperature: float = 1.0
    """Temperature of the held-out samples."""

    # ---------------------------------------------------------------- where and how
    out_dir: str = "runs/default"
    """Where ``config.json``, ``metrics.jsonl``, the checkpoint and the final model go."""
    checkpoint_every: int = 10
    """Save the whole training state every this many steps (0: only at the end)."""
    resume: bool = True
    """Continue from ``out_dir/checkpoint`` when it exists."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    dtype: str = "auto"
    """``auto``: bf16 autocast on CUDA (fp32 weights and optimizer), fp32 on CPU; or ``fp32``."""
    threads: int = 0
    """torch CPU threads (0: leave torch's default)."""
    save_model: bool = True
    """Write the final policy as a Hugging Face checkpoint to ``out_dir/final``."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`~rlcurate.errors.UserError` (a ``ValueError``) naming the first bad field."""
        positive_int = ["steps", "prompts_per_step", "group_size", "max_new_tokens", "gen_token_budget",
                        "update_epochs", "minibatches", "micro_batch_tokens", "eval_prompts", "eval_samples"]
        for name in positive_int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name} must be a positive integer, got {v!r}")
        for name in ["eval_every", "checkpoint_every", "warmup_steps", "seed", "threads", "max_rollouts",
                     "max_prompt_tokens", "eval_every_rollouts", "order_offset"]:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UserError(f"{name} must be an integer >= 0, got {v!r}")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "float" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise UserError(f"{f.name} must be a finite number, got {v!r}")
        for name in ["temperature", "eval_temperature"]:
            v = getattr(self, name)
            if not v > 0:
                raise UserError(f"{name} must be > 0 (RL needs sampling), got {v!r}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        for name in ["lr", "adv_eps"]:
            if not getattr(self, name) > 0:
                raise UserError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ["clip_low", "clip_high", "kl_coef", "weight_decay", "grad_clip", "log_ratio_clamp", "kl_clamp",
                     "micro_batch_memory_gib"]:
            if not getattr(self, name) >= 0:
                raise UserError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.clip_low < 1:
            raise UserError(f"clip_low must lie in [0, 1): the ratio is kept above 1 - clip_low, and {self.clip_low!r} "
                            "would leave no lower clip")
        if not isinstance(self.out_dir, str) or not self.out_dir.strip():
            raise UserError(f"out_dir must name a folder for the run's checkpoints and metrics, got {self.out_dir!r}")
        if not (self.clip_ratio_c == 0 or self.clip_ratio_c > 1):
            raise UserError(f"clip_ratio_c must be 0 (off) or > 1, got {self.clip_ratio_c!r}")
        from rlcurate.curation.base import GROUP_ADVANTAGES
        from rlcurate.train.report import parse_report_to

        parse_report_to(self.report_to)
        choices = {"advantage": GROUP_ADVANTAGES,
                   "loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
                   "lr_schedule": ("constant", "cosine"), "device": ("auto", "cpu", "cuda"),
                   "dtype": ("auto", "fp32", "bf16"), "decode": DECODE_MODES,
                   "rollout_weights": ("train", "bf16")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise UserError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.eval_split not in ("test", "validation"):
            raise UserError(f"eval_split must be test or validation, got {self.eval_split!r}")
        for name in ["task_kwargs", "strategy_kwargs"]:
            if not isinstance(getattr(self, name), dict):
                raise UserError(f"{name} must be a mapping, got {getattr(self, name)!r}")
        if isinstance(self.betas, (list, tuple)):
            self.betas = tuple(self.betas)
        if (not isinstance(self.betas, tuple) or len(self.betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in self.betas)):
            raise UserError(f"betas must be two numbers in [0, 1), got {self.betas!r}")

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "TrainConfig":
        """Build from a mapping, rejecting unknown keys with the list of known ones."""
        if not isinstance(data, dict):
            raise UserError(f"{source}: the config must be a mapping of keys to values, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            near = difflib.get_close_matches(str(unknown[0]), sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise UserError(f"{source}: unknown key(s) {', '.join(map(str, unknown))}{hint}; "
                            f"known keys: {', '.join(sorted(known))}")
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        clean = {}
        for k, v in data.items():
            clean[k] = _coerce(k, types[k], v, source)
        try:
            return cls(**clean)
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> "TrainConfig":
        """Read a YAML file and apply ``key=value`` overrides (values parsed as YAML)."""
        data = read_yaml(path, what="config file")
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserError(f"{path}: the config must be a mapping of keys to values, got a {type(data).__name__}")
        source = f"{path} (with --set)" if overrides else str(path)
        data = apply_overrides(data, overrides or [])
        if "model" in data:
            data["model"] = _beside(data["model"], Path(path))
        return cls.from_dict(data, source=source)

    @property
    def planned_steps(self) -> int:
        """The steps a uniform run of this config takes: ``steps``, or fewer when ``max_rollouts`` stops it first."""
        return self.steps if not self.max_rollouts else min(
            self.steps, math.ceil(self.max_rollouts / (self.prompts_per_step * self.group_size)))

    def out_dir_need(self, checkpoint: int, weights: int, resumed: bool = False) -> tuple[int, str]:
        """``(bytes, why)``: the most disk a run of this config adds to ``out_dir`` at once, for checkpoints of
        ``checkpoint`` bytes and a final model of ``weights`` bytes (``save_model``). The previous checkpoint is
        removed only after the next is written, and before the final model is: a fresh run that saves before
        its end peaks at two checkpoints, one that saves only at its end at one checkpoint and the final model,
        a resumed run (its checkpoint on disk already) at one more checkpoint (a checkpoint holds the weights and
        more). Whether a run saves before its end is read from :attr:`planned_steps`, a uniform run's steps: a
        curator that spends more rollouts a step under ``max_rollouts`` may take too few steps to, and then
        needs less than this says."""
        if resumed:
            return checkpoint, "one beside the checkpoint on disk"
        if self.checkpoint_every and self.checkpoint_every < self.planned_steps:
            return 2 * checkpoint, "two while one replaces the other"
        if self.save_model:
            return checkpoint + weights, f"one at the end, and {weights / 2**30:.2f} GiB for the final model (save_model)"
        return checkpoint, "one at the end"

    def warmup_note(self) -> str | None:
        """Why the warm-up cannot finish, or ``None``: ``warmup_steps`` at or past the steps the run takes
        (:attr:`planned_steps`), so the rate never reaches ``lr``. A warning, not an error: a short trial of a
        long config (a chapter's dry run) cuts the steps on purpose."""
        steps = self.planned_steps
        if not self.warmup_steps or self.warmup_steps < steps:
            return None
        return (f"warmup_steps ({self.warmup_steps}) is not fewer than the run's steps ({steps}"
                + (f", the steps max_rollouts={self.max_rollouts} allows at {self.prompts_per_step} x "
                   f"{self.group_size} rollouts a step" if steps < self.steps else "")
                + f"): the learning rate never reaches lr={self.lr:g}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def _beside(model, config_path: Path):
    """A relative model path that does not exist from the current folder, read from the first folder above
    the config file that holds it (configs name checkpoints relative to the repository root, so that
    ``rlcurate train --config ../rlcurate/configs/tiny_uniform.yaml`` works from anywhere); else unchanged."""
    if not isinstance(model, str) or not model or Path(model).is_absolute() or Path(model).exists() \
            or not ("/" in model or model.startswith(".")):
        return model
    for parent in config_path.resolve().parents:
        if (parent / model / "config.json").is_file():
            return str(parent / model)
    return model


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (plain YAML keeps the last one silently,
    and a config that sets ``lr`` twice is a mistake, not an override)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "file"):
    """The YAML document in ``path``; a missing, unreadable or malformed file raises
    :class:`~rlcurate.errors.UserError` naming the file (and the line of a syntax error)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}" + (" (a directory)" if path.is_dir() else ""))
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}: not valid YAML{where}: {problem}") from None


def _coerce(name: str, kind: str, value, source: str):
    """YAML reads ``3e-4`` as a string and ``1`` as an int; turn them into the field's type."""
    if kind == "float" and not isinstance(value, bool):
        if isinstance(value, int):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise UserError(f"{source}: {name} must be a number, got {value!r}") from None
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "bool" and not isinstance(value, bool):
        raise UserError(f"{source}: {name} must be true or false, got {value!r}")
    if kind == "str" and not isinstance(value, str):
        raise UserError(f"{source}: {name} must be a string, got {value!r}")
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings; ``a.b=v`` sets a key inside a mapping field."""
    out = dict(data)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set {item!r}: an override must look like key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"--set {item!r}: cannot parse the value as YAML: {problem}") from None
        if "." in key:
            head, sub = key.split(".", 1)
            if not isinstance(out.get(head) or {}, dict):
                raise UserError(f"--set {item!r}: {head} is not a mapping, so it has no key {sub!r}")
            inner = dict(out.get(head) or {})
            inner[sub] = value
            out[head] = inner
        else:
            out[key] = value
    return out


def field_docs(cls=TrainConfig) -> dict[str, str]:
    """The docstring written under each field of a dataclass (for ``--help`` and the docs);
    :func:`rlcurate.config_cli.field_docs`, with :class:`TrainConfig` as the default class."""
    from rlcurate.config_cli import field_docs as docs

    return docs(cls)
