"""A chapter's scratch folder (rlcurate.book.scratch_dir) is gone once its process exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_scratch_folder_is_removed_when_its_process_exits(tmp_path):
    code = ("from rlcurate.book import scratch_dir\n"
            "work = scratch_dir('ch0')\n"
            "(work / 'run').mkdir(); (work / 'run' / 'state.pt').write_bytes(b'x' * 1000)\n"
            "print(work)\n")
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    folder = Path(out.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("rlcurate-ch0-")
    assert not folder.exists() and not list(tmp_path.iterdir())
