"""Execute chapters in place so that their stored outputs match the current code (``make notebooks``).

    python -m rlcurate.book.execute book/01_gate.ipynb [more.ipynb ...] [--profile cpu]

Each notebook runs in its own folder with ``RLCURATE_PROFILE`` set; its wall time is printed. The
tests never write over a source notebook: they execute copies in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def execute_notebook(path: Path, profile: str, timeout: int = 3600, output: Path | None = None) -> float:
    """Run ``path`` top to bottom in ``profile`` and write it to ``output`` (default: in place).
    Returns the wall time in seconds."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("RLCURATE_PROFILE")
    os.environ["RLCURATE_PROFILE"] = profile
    try:
        start = time.perf_counter()
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        elapsed = time.perf_counter() - start
    finally:
        if old is None:
            os.environ.pop("RLCURATE_PROFILE", None)
        else:
            os.environ["RLCURATE_PROFILE"] = old
    nbformat.write(nb, output or path)
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--profile", default=os.environ.get("RLCURATE_PROFILE", "cpu"),
                        choices=["smoke", "cpu", "gpu"])
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)
    for nb in args.notebooks:
        if not nb.is_file():
            parser.error(f"no such notebook: {nb}")
        seconds = execute_notebook(nb, args.profile, args.timeout)
        print(f"{nb}: {seconds:.1f} s ({args.profile})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
