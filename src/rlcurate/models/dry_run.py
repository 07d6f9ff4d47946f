"""The switch of a chapter's dry run (``RLCURATE_DRYRUN=1``) at the level of models: a Hub id of
:mod:`rlcurate.models.architectures` becomes a random-weight checkpoint of its architecture with
:data:`DRY_RUN_LAYERS` layers and the real Qwen tokenizer (:mod:`rlcurate.dryrun`, appendix A1)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rlcurate.errors import UserError

__all__ = ["DRY_RUN_ENV", "DRY_RUN_LAYERS", "dry_run_active", "dry_run_checkpoint", "dry_run_model", "tokenizer_dir"]


DRY_RUN_ENV = "RLCURATE_DRYRUN"
DRY_RUN_LAYERS = 2  # layers of the random-weight checkpoints of a chapter's dry run (widths and vocabulary real)


def dry_run_active() -> bool:
    """Whether ``RLCURATE_DRYRUN`` asks for a dry run of the chapters' GPU cells (module docstring)."""
    return os.environ.get(DRY_RUN_ENV, "").strip().lower() in ("1", "true", "yes")


def dry_run_checkpoint(model_id: str) -> Path:
    """A random-weight checkpoint of ``model_id``'s architecture with :data:`DRY_RUN_LAYERS` layers and the
    real Qwen tokenizer (:func:`tokenizer_dir`), written once into the temporary folder and reused. The
    folder's name holds a hash of the architecture's fields, the layer count and the tokenizer's folder,
    so a change to any of them builds a new checkpoint instead of reusing a stale one."""
    import hashlib
    import json
    import shutil

    from rlcurate.models.architectures import architecture, random_checkpoint

    tokenizer = tokenizer_dir()
    key = json.dumps([architecture(model_id), DRY_RUN_LAYERS, str(tokenizer.resolve())], sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"rlcurate_dryrun_{model_id.replace('/', '--')}_{DRY_RUN_LAYERS}l_{digest}"
    if not (folder / "config.json").is_file():
        partial = Path(tempfile.mkdtemp(prefix=folder.name + "_", dir=folder.parent))
        try:
            random_checkpoint(model_id, partial, tokenizer, num_hidden_layers=DRY_RUN_LAYERS)
            try:
                partial.rename(folder)
            except OSError:  # built meanwhile by another process
                pass
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def dry_run_model(spec: str) -> Path | None:
    """Under ``RLCURATE_DRYRUN=1``, the random-weight checkpoint that stands in for ``spec`` when ``spec`` is a
    Hub id of :mod:`rlcurate.models.architectures` and not a local folder; else ``None`` (the one test of
    whether a dry run replaces a model: loading, the trainer and the cut config all use it)."""
    from rlcurate.models.architectures import ARCHITECTURES

    if not dry_run_active() or spec not in ARCHITECTURES or Path(spec).exists():
        return None
    return dry_run_checkpoint(spec)


def tokenizer_dir() -> Path:
    """The Qwen tokenizer of the dry run: ``$RLCURATE_TOKENIZER_DIR``, else ``qwen2.5-tokenizer`` in
    ``$RLCURATE_DATA_DIR``."""
    explicit = os.environ.get("RLCURATE_TOKENIZER_DIR")
    if explicit:
        path = Path(explicit)
    else:
        from rlcurate.tasks.datasets import DATA_DIR_ENV

        data = os.environ.get(DATA_DIR_ENV)
        if not data:
            raise UserError("the dry run needs the Qwen tokenizer: set RLCURATE_TOKENIZER_DIR, or RLCURATE_DATA_DIR "
                            "to a folder holding qwen2.5-tokenizer/")
        path = Path(data) / "qwen2.5-tokenizer"
    if not (path / "tokenizer.json").is_file() and not (path / "vocab.json").is_file():
        raise UserError(f"tokenizer folder {path} holds no tokenizer.json or vocab.json")
    return path
