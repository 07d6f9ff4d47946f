"""The configuration of a variance audit and its errors (chapter 4, *The variance audit*).

:class:`AuditConfig` says what to audit and how to sample; it is saved to an audit's ``config.json``
and its fields are the options of ``rlcurate audit`` (:mod:`rlcurate.audit.cli`, built from their
docstrings by :mod:`rlcurate.config_cli`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from rlcurate.errors import UserError

__all__ = ["AuditConfig", "AuditError", "AuditStopped", "AuditTerminated", "BACKENDS", "ENDPOINTS",
           "REWARD_ERROR_POLICIES"]

BACKENDS = ("transformers", "openai")
ENDPOINTS = ("completions", "chat")
REWARD_ERROR_POLICIES = ("zero", "stop")
# Settings that may differ between the invocations of one audit: where the server is, how
# failures of the verifier are handled, and how many samples are audited (the audit order is
# prefix-stable, so a larger limit extends an audit and a smaller one summarises a prefix).
_NOT_IDENTITY = ("limit", "base_url", "on_reward_error")


class AuditError(UserError):
    """Bad input to an audit (chapter 4): unknown model or task, malformed data, a folder that holds
    a different audit or cannot be written. The message names the offending argument or file."""


class AuditStopped(RuntimeError):
    """An audit stopped early (a failing reward function with ``on_reward_error="stop"``, a file it
    could not write); every batch finished before it is on disk, and running the audit again resumes
    it."""


class AuditTerminated(KeyboardInterrupt):
    """The audit received ``SIGTERM``; raised between two writes, so that every finished batch is on
    disk and the session is recorded in ``sessions.jsonl``."""


@dataclass
class AuditConfig:
    """What to audit and how to sample (chapter 4). Saved to ``config.json``; a resumed audit must
    use the same values except ``limit``, ``base_url`` and ``on_reward_error``."""

    model: str
    """Checkpoint directory (``data/tiny/spread``), ``smollm2``, or a Hugging Face Hub id. With the
    ``openai`` backend it only provides the tokenizer whose chat template renders the prompts
    (default: ``model_name``)."""
    task: str = "arithmetic"
    """Task name for :func:`rlcurate.tasks.get_task` (``arithmetic``, ``gsm8k``, ``math500``, ...)."""
    task_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the task (``{"style": "chat", "n_test": 8}``, ``{"data_dir": ...}``)."""
    split: str = "test"
    """Which split of the task to audit."""
    runs: int = 4
    """Completions per sample, N."""
    limit: int | None = None
    """Audit only the first ``limit`` samples of the audit order (None: all)."""
    shuffle: bool = True
    """Audit the split in a random order drawn with ``subset_seed`` (so that ``limit`` takes a random
    subset, not the first levels or files); False keeps the task's order."""
    subset_seed: int = 0
    """Seed of the audit order; independent of ``seed`` so that two audits with different sampling
    seeds look at the same samples."""
    seed: int = 0
    """Sampling seed; chunk ``c`` is generated with ``chunk_seed(seed, c)``."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy, which makes every sample zero-variance by construction)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1: off)."""
    top_k: int = 0
    """Top-k truncation (0: off)."""
    max_new_tokens: int = 64
    """Most tokens per completion."""
    stop: tuple[str, ...] = ()
    """Stop strings (kept in the completion text)."""
    chunk_size: int = 32
    """Samples per chunk; part of what fixes the random streams. A chunk is generated and written
    in batches of whole samples that fit ``token_budget`` (:func:`sub_batches`)."""
    success_threshold: float = 1.0
    """A run counts as a success (for categories and pass@k) when its score is >= this; in (0, 1],
    since rewards lie in [0, 1]."""
    backend: str = "transformers"
    """``transformers`` (local model) or ``openai`` (an OpenAI-compatible server at ``base_url``)."""
    base_url: str | None = None
    """Server root for the ``openai`` backend, e.g. ``http://127.0.0.1:8000/v1``."""
    model_name: str | None = None
    """Served model name for the ``openai`` backend (default: ``model``)."""
    endpoint: str = "completions"
    """``openai`` backend: ``completions`` sends prompts rendered with ``model``'s tokenizer to
    ``/v1/completions``; ``chat`` sends the task's chat turns (and its prefill, as a final assistant
    message to continue) to ``/v1/chat/completions``, where the server applies its own template."""
    device: str = "auto"
    """Device of the local model (``auto``: CUDA, then MPS, then CPU)."""
    dtype: str = "auto"
    """Dtype of the local model (``auto``: bfloat16 on a GPU, float32 on the CPU)."""
    token_budget: int = 16384
    """Tokens (rows x (longest prompt + ``max_new_tokens``)) per generation call and per write (it sets
    the batch shapes, so it is part of the audit's identity); lower it to see and save progress more
    often with a large model."""
    on_reward_error: str = "zero"
    """A reward function that raises: ``zero`` scores the run 0 and keeps the error as its reason;
    ``stop`` writes everything finished so far and stops (:class:`AuditStopped`)."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> "AuditConfig":
        """Raise :class:`AuditError` naming the first bad field; return self."""

        def bad(name, what):
            raise AuditError(f"{name} must be {what}, got {getattr(self, name)!r}")

        def is_int(v, minimum):
            return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= minimum

        if not isinstance(self.model, str) or not self.model.strip():
            bad("model", "a checkpoint directory, 'smollm2' or a Hub id")
        if not isinstance(self.task, str) or not self.task.strip():
            bad("task", "a task name")
        if not isinstance(self.task_kwargs, dict):
            bad("task_kwargs", "a dict (a JSON object on the command line)")
        if not isinstance(self.split, str) or not self.split:
            bad("split", "a split name such as 'test'")
        for name, minimum in (("runs", 1), ("chunk_size", 1), ("max_new_tokens", 1), ("token_budget", 1),
                              ("seed", 0), ("subset_seed", 0), ("top_k", 0)):
            if not is_int(getattr(self, name), minimum):
                bad(name, f"an integer >= {minimum}")
        if self.limit is not None and not is_int(self.limit, 1):
            bad("limit", "None or an integer >= 1")
        if not isinstance(self.shuffle, bool):
            bad("shuffle", "True or False")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            bad("temperature", "a finite number >= 0")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
            bad("top_p", "a number in (0, 1]")
        s = self.success_threshold
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not 0 < s <= 1:
            bad("success_threshold", "a number in (0, 1], the range of the rewards, r(x, a) in [0, 1]")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if any(not isinstance(x, str) or not x for x in self.stop):
            bad("stop", "a list of non-empty strings")
        if self.backend not in BACKENDS:
            bad("backend", f"one of {', '.join(BACKENDS)}")
        if self.endpoint not in ENDPOINTS:
            bad("endpoint", f"one of {', '.join(ENDPOINTS)}")
        if self.endpoint == "chat" and self.backend != "openai":
            raise AuditError("endpoint 'chat' needs backend 'openai' (a server's /v1/chat/completions)")
        if self.backend != "openai" and (self.base_url or self.model_name):
            raise AuditError(f"{'base_url' if self.base_url else 'model_name'} is for backend 'openai' (a server); "
                             f"backend {self.backend!r} audits the local model: add --backend openai")
        if self.backend == "openai" and not self.base_url:
            raise AuditError("base_url is required with backend 'openai' (e.g. http://127.0.0.1:8000/v1)")
        if self.on_reward_error not in REWARD_ERROR_POLICIES:
            bad("on_reward_error", f"one of {', '.join(REWARD_ERROR_POLICIES)}")
        return self

    def to_dict(self) -> dict:
        """The configuration as JSON-ready values."""
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "AuditConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`AuditError`."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise AuditError(f"unknown audit config keys: {sorted(unknown)}")
        d = dict(d)
        if "stop" in d:
            d["stop"] = tuple(d["stop"])
        return cls(**d)

    def identity(self) -> dict:
        """The fields that must match for two invocations to be one audit."""
        d = self.to_dict()
        for k in _NOT_IDENTITY:
            d.pop(k)
        return d

    def sampling_params(self):
        """The :class:`~rlcurate.rollout.SamplingParams` of this audit."""
        from rlcurate.rollout import SamplingParams

        return SamplingParams(temperature=float(self.temperature), top_p=float(self.top_p), top_k=int(self.top_k),
                              max_new_tokens=int(self.max_new_tokens), stop=tuple(self.stop))
