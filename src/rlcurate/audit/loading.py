"""What an audit samples from (chapter 4, *The variance audit*): the rollout engine and tokenizer of
its model, and the task's problems in audit order; each failure is an :class:`AuditError` that names
the model, the task or the file.
"""

from __future__ import annotations

from rlcurate.audit.config import AuditConfig, AuditError
from rlcurate.audit.seeds import audit_order
from rlcurate.provenance import provenance

__all__ = ["device_info", "load_problems", "load_tokenizer", "make_engine"]


def load_tokenizer(spec: str):
    """The tokenizer (with left padding and a chat template) of a checkpoint or Hub id, for rendering
    prompts sent to a server."""
    from rlcurate.models.hf import load_smollm2, prepare_tokenizer

    if spec == "smollm2":
        return load_smollm2()[1]
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as exc:
        raise AuditError(f"model={spec!r}: cannot load its tokenizer (needed to render prompts): "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    return prepare_tokenizer(tok, name=spec)


def make_engine(config: AuditConfig):
    """``(engine, tokenizer)`` for ``config`` (chapter 4): a :class:`~rlcurate.rollout.TransformersEngine`
    over :func:`rlcurate.models.load_policy`, or an :class:`~rlcurate.rollout.OpenAIEngine` plus the
    tokenizer of ``config.model``. Raises :class:`AuditError` naming a model that cannot be loaded."""
    from rlcurate.rollout import OpenAIEngine, TransformersEngine

    if config.backend == "openai":
        name = config.model_name or config.model
        try:
            engine = OpenAIEngine(config.base_url, name, endpoint=config.endpoint)
        except ValueError as exc:
            raise AuditError(f"base_url: {exc}") from None
        try:
            served = engine.models()
        except Exception:  # a server that cannot be reached is said where generation starts (resumable)
            served = None
        if served is not None and name not in served:  # before config.json records it: every request would fail
            raise AuditError(f"model_name={name!r}: the server at {config.base_url} serves "
                             f"{', '.join(map(repr, served)) or 'no model'}; pass --model-name with one of them")
        return engine, None if config.endpoint == "chat" else load_tokenizer(config.model)
    from rlcurate.models import load_policy

    try:
        model, tokenizer = load_policy(config.model, device=config.device, dtype=config.dtype)
    except (ValueError, OSError, ImportError) as exc:
        raise AuditError(f"model={config.model!r} cannot be loaded: {exc}") from None
    return TransformersEngine(model, tokenizer, token_budget=int(config.token_budget)), tokenizer


def load_problems(config: AuditConfig, task=None):
    """``(task, problems)`` of ``config`` in audit order (:func:`~rlcurate.audit.seeds.audit_order`);
    :class:`AuditError` naming the task, the split or the data file that is wrong."""
    from rlcurate.tasks import get_task

    if task is None:
        try:
            task = get_task(config.task, **config.task_kwargs)
        except TypeError as exc:
            raise AuditError(f"task_kwargs {config.task_kwargs!r} do not fit task {config.task!r}: {exc}") from None
        except ValueError as exc:
            raise AuditError(f"task={config.task!r}: {exc}") from None
    try:
        problems = task.problems(config.split)
    except ValueError as exc:  # includes DatasetFormatError (file, line, field)
        raise AuditError(f"task {config.task!r}, split {config.split!r}: {exc}") from None
    except (OSError, ImportError) as exc:
        raise AuditError(f"task {config.task!r}, split {config.split!r}: cannot read the data: {exc}") from None
    if not problems:
        raise AuditError(f"task {config.task!r}, split {config.split!r} has no problems")
    order = audit_order(len(problems), config)
    return task, [problems[i] for i in order]


def device_info(engine, env: dict | None = None) -> str:
    """A short description of where ``engine`` runs (the ``device`` of an audit's ``config.json``),
    from its :func:`~rlcurate.provenance.provenance` record ``env``."""
    dev = getattr(engine, "device", None)
    if dev is None:
        return f"server {getattr(engine, 'base_url', '?')}"
    env = provenance(device=dev) if env is None else env
    where = env["gpu"] or f"{env['cpu']}, {env['cores']} cores, {env['threads']} torch threads"
    return f"{dev} ({where})"
