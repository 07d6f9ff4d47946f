"""Checks of a training run that need no model (chapter 5, *The GRPO loop*).

:func:`preflight` runs before the policy loads (and, from ``rlcurate train``, before torch is
imported), so a misspelt strategy, a task argument it does not take, a missing checkpoint folder or
a run folder that holds a different run fails in about a second with one line, not after a model
load. Every refusal is a :class:`~rlcurate.errors.UserError` naming the config key.

Resuming. ``out_dir/checkpoint`` remembers the config it was trained with. A resumed run must use
the same config, key for key (a key the checkpoint does not know counts as its default), except the
keys in :data:`RESUMABLE_CHANGES`: those that say how far to train (``steps``, ``max_rollouts``) and
those that do not change what is computed (where and how often to write, threads, the progress bar).
Any other difference is refused with the list ``key: saved -> new``. ``steps`` may change only
with a ``constant`` learning-rate schedule (a cosine schedule is a function of ``steps``, so the
steps already taken would belong to another run), and neither ``steps`` nor ``max_rollouts`` may
fall below what the checkpoint has already done. A change of ``steps`` or ``max_rollouts`` is logged
and recorded in ``trainer.json`` and ``summary.json`` under ``config_changes``; the other allowed
keys change nothing that is computed and are not recorded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlcurate.errors import UserError
from rlcurate.train.config import TrainConfig

# Keys a resumed run may change: how far to train (recorded), and what does not change the computation.
EXTENSIONS = frozenset({"steps", "max_rollouts"})
RESUMABLE_CHANGES = EXTENSIONS | {"out_dir", "resume", "progress", "threads", "save_model", "checkpoint_every", "decode",
                                  "report_to"}


def checkpoint_dir(out_dir: str | Path) -> Path | None:
    """The checkpoint a resume would load: ``checkpoint``, else ``checkpoint.old`` (a run killed
    between the two renames of a save), else ``None``."""
    for name in ("checkpoint", "checkpoint.old"):
        path = Path(out_dir) / name
        if path.exists():
            return path
    return None


DAMAGED_REMEDY = "the checkpoint is damaged: move it away, or set resume=false to start over (the checkpoint is then replaced)"


def read_checkpoint_meta(path: Path) -> dict[str, Any]:
    """``trainer.json`` of a checkpoint; an unreadable one is refused (it cannot be resumed)."""
    try:
        meta = json.loads((path / "trainer.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read trainer.json ({exc}); {DAMAGED_REMEDY}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise UserError(f"{path}/trainer.json holds no config; set resume=false to start over")
    state = path / "state.pt"
    if not state.is_file() or state.stat().st_size == 0:
        raise UserError(f"{state} is missing or empty; {DAMAGED_REMEDY}")
    return meta


def config_changes(saved: dict[str, Any], config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, new)}`` for every key whose value differs (a key missing from ``saved``
    counts as its default value)."""
    defaults = TrainConfig().to_dict() if any(k not in saved for k in config.to_dict()) else {}
    out = {}
    for key, new in config.to_dict().items():
        old = saved.get(key, defaults.get(key))
        if _normal(old) != _normal(new):
            out[key] = (old, new)
    return out


def _normal(value):
    return json.loads(json.dumps(value, sort_keys=True))  # tuples as lists, as in config.json


def _fmt(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changes.items()))


RESULTS_REMEDY = "use another out_dir, or set resume=false to overwrite them"


def check_results_kept(config: TrainConfig) -> None:
    """Refuse to write over the results of another run: an ``out_dir`` without a checkpoint (a finished run whose
    checkpoint was removed, as ``rlcurate runs`` does) whose ``config.json`` differs from ``config`` in a key
    that a resume could not change either (:data:`RESUMABLE_CHANGES`).
    ``resume=false`` says to overwrite them."""
    saved_path = Path(config.out_dir) / "config.json"
    if not saved_path.is_file():
        return
    try:
        saved = json.loads(saved_path.read_text())
    except (OSError, ValueError):
        return  # not a readable run's config: nothing this check can compare
    if not isinstance(saved, dict):
        return
    changes = {k: v for k, v in config_changes(saved, config).items() if k not in RESUMABLE_CHANGES}
    if changes:
        raise UserError(f"out_dir {config.out_dir} holds the results of a run with a different config ({_fmt(changes)}) "
                        f"and no checkpoint to resume; {RESULTS_REMEDY}")


RESUME_REMEDY = "use another out_dir, or set resume=false to start over in this one (its checkpoint is then replaced)"


def check_resume(config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The changes of :data:`EXTENSIONS` a resume of ``config.out_dir`` would make to the checkpoint's
    config, ``{key: (saved, new)}`` (empty when there is nothing to resume); refuses changes outside
    :data:`RESUMABLE_CHANGES` and extensions that cannot be honoured (see the module docstring)."""
    path = checkpoint_dir(config.out_dir) if config.resume else None
    if path is None:
        if config.resume:
            check_results_kept(config)
        return {}
    meta = read_checkpoint_meta(path)
    step = int(meta.get("step", 0))
    changes = config_changes(meta["config"], config)
    where = f"out_dir {config.out_dir} holds a checkpoint at step {step}"
    remedy = RESUME_REMEDY
    refused = {k: v for k, v in changes.items() if k not in RESUMABLE_CHANGES}
    if refused:
        raise UserError(f"{where} made with a different config: {_fmt(refused)}; a resumed run must keep every "
                        f"key except {', '.join(sorted(RESUMABLE_CHANGES))}: {remedy}")
    if "steps" in changes:
        if config.lr_schedule == "cosine":
            raise UserError(f"{where}: steps: {changes['steps'][0]!r} -> {config.steps!r} would change the cosine "
                            f"learning-rate schedule of the steps already taken; keep steps={changes['steps'][0]!r} "
                            f"or {remedy}")
        if config.steps < step:
            raise UserError(f"{where}, past steps={config.steps}; keep steps >= {step} or {remedy}")
    spent = int((meta.get("totals") or {}).get("rollouts", 0))
    if "max_rollouts" in changes and 0 < config.max_rollouts < spent:
        raise UserError(f"{where} that has spent {spent} rollouts, more than max_rollouts={config.max_rollouts}; "
                        f"keep max_rollouts >= {spent} (or 0) or {remedy}")
    return {k: v for k, v in changes.items() if k in EXTENSIONS}


def check_out_dir(out_dir: str) -> None:
    """Refuse an ``out_dir`` that is a file, lies under a file, or cannot be written."""
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"out_dir={out_dir!r} is a file, not a directory")
    existing = next(p for p in [path, *path.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise UserError(f"out_dir={out_dir!r} cannot be made: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"out_dir={out_dir!r} cannot be written: no write permission on {existing}")
    import tempfile

    try:  # os.access says yes to root everywhere: try it (a file in the folder, or a folder where it would go)
        if path.is_dir():
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as exc:
        raise UserError(f"out_dir={out_dir!r} cannot be written: {exc.strerror or exc} ({existing})") from None


def check_group_size(config: TrainConfig, curator) -> None:
    """Refuse ``group_size=1`` where every advantage would be 0: grpo, drgrpo and rloo compare a
    rollout with the rest of its group. Only a sampler that keeps a pool baseline
    (``Sampler.pool_baseline``; ``ada_seq_*``: p_hat of all the rollouts it drew) gives one kept rollout
    a signal, with ``grpo`` or ``drgrpo``."""
    if config.group_size >= 2:
        return
    if getattr(getattr(curator, "sampler", None), "pool_baseline", False) and config.advantage != "rloo":
        return
    raise UserError(f"group_size={config.group_size} with advantage={config.advantage} and strategy="
                    f"{config.strategy}: the advantage compares each rollout with the others of its group, so with "
                    "one rollout it is 0 and nothing is learned (loss and gradient 0 at every step); use "
                    "group_size >= 2")


def train_subset(config: TrainConfig, problems) -> list:
    """The training problems named by ``config.train_subset`` (a JSON-lines file of ``uid`` lines), in
    the task's order; a file that cannot be read, or names none of them, is refused."""
    from rlcurate.tasks.datasets import read_jsonl

    path = Path(config.train_subset)
    if not path.is_file():
        raise UserError(f"train_subset={config.train_subset!r}: no such file")
    uids = {str(row.data["uid"]) for row in read_jsonl(path) if "uid" in row.data}
    kept = [p for p in problems if p.uid in uids]
    if not kept:
        raise UserError(f"train_subset={config.train_subset!r}: none of its {len(uids)} uids is a training prompt "
                        f"of task {config.task!r} with task_kwargs {config.task_kwargs} (export the audit of "
                        "the same task and split train)")
    return kept


def check_pool_size(config: TrainConfig, train_problems, left_out: int = 0) -> None:
    """Refuse ``prompts_per_step`` beyond the training pool: a step's prompts are distinct for the belief
    selectors (which could not choose them), and a step that repeats a prompt or takes fewer than asked is
    not the run the config describes (a larger ``group_size`` is how a prompt gets more rollouts). Checked
    before the model loads, and again after prompts longer than ``max_prompt_tokens`` are left out
    (``left_out`` of them)."""
    n = len(train_problems)
    if config.prompts_per_step <= n:
        return
    subset = f" (train_subset={config.train_subset!r})" if config.train_subset else ""
    longer = f", after {left_out} longer than max_prompt_tokens={config.max_prompt_tokens} were left out" \
        if left_out else ""
    raise UserError(f"prompts_per_step={config.prompts_per_step} is more than the {n} training prompts of task "
                    f"{config.task!r}{subset}{longer}: a step takes each prompt at most once; lower "
                    f"prompts_per_step to {n} or less (group_size={config.group_size} rollouts each), or train on "
                    f"a larger pool")


def check_device(config: TrainConfig) -> None:
    """Refuse ``device=cuda`` or ``dtype=bf16`` on a machine without CUDA, and ``dtype=bf16`` with ``device=cpu``
    anywhere, before any folder is made (torch is imported only for these two settings)."""
    if config.device != "cuda" and config.dtype != "bf16":
        return
    import torch

    if not torch.cuda.is_available():
        setting = "device=cuda" if config.device == "cuda" else "dtype=bf16"
        raise UserError(f"{setting} but CUDA is not available on this machine; use device=cpu (or auto) and "
                        "dtype=fp32 (or auto) here")
    if config.dtype == "bf16" and config.device == "cpu":  # the trainer's bf16 is CUDA autocast
        raise UserError("dtype=bf16 with device=cpu: bf16 training needs CUDA; use dtype=fp32 (or auto) on the CPU, "
                        "or device=cuda (or auto)")


def preflight(config: TrainConfig, *, task=None, curator=None, check_model: bool = True):
    """Every check of a run that needs no model (torch is imported only for ``device=cuda`` or ``dtype=bf16``,
    :func:`check_device`); returns ``(task, curator, changes)``: the task and
    curator built from the config unless given, and the allowed config changes of a resume
    (:func:`check_resume`)."""
    if curator is None:
        from rlcurate.curation import build_curator

        curator = build_curator(config.strategy, **config.strategy_kwargs)
    check_group_size(config, curator)
    if task is None:
        from rlcurate.tasks.datasets import DatasetUnavailableError
        from rlcurate.tasks.registry import get_task

        task = get_task(config.task, **config.task_kwargs)
        try:
            if not task.problems("train"):
                raise UserError(f"task {config.task!r} with task_kwargs {config.task_kwargs} has no training problems")
            if (config.eval_every or config.eval_every_rollouts) and not task.problems(config.eval_split):
                raise UserError(f"task {config.task!r} with task_kwargs {config.task_kwargs} has no {config.eval_split} "
                                f"problems to evaluate on; set eval_every=0 and eval_every_rollouts=0, or give it some")
        except UserError:
            raise
        except (DatasetUnavailableError, ValueError, OSError) as exc:  # a data folder or file that cannot be read
            raise UserError(f"task {config.task!r}: {exc}") from None
    check_task = getattr(getattr(curator, "sampler", None), "check_task", None)
    if callable(check_task):  # e.g. SAGE's hint_mode='prefix' on a task that puts hints in the user turn only
        try:
            check_task(task)
        except ValueError as exc:
            raise UserError(f"strategy {config.strategy!r} with task {config.task!r}: {exc}") from None
    check_pool_size(config, train_subset(config, task.problems("train")) if config.train_subset
                    else task.problems("train"))
    if check_model:
        from rlcurate.models.hf import check_model_source

        check_model_source(config.model)
    check_out_dir(config.out_dir)
    check_device(config)  # before the resume check: a setting this machine cannot run is the first thing to fix
    changes = check_resume(config)
    return task, curator, changes
