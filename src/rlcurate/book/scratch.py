"""A chapter's scratch folder: the runs and audits it makes while it executes."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path


def scratch_dir(chapter: str) -> Path:
    """A fresh folder ``rlcurate-<chapter>-*`` in the temporary directory, removed when the process (the
    chapter's kernel) exits. A chapter's runs hold checkpoints (GBs in the cpu profile); what a reader keeps
    is in the executed notebook and in ``data/``, so nothing is left behind in ``/tmp``."""
    folder = Path(tempfile.mkdtemp(prefix=f"rlcurate-{chapter}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
