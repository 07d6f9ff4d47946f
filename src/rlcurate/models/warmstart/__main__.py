"""``python -m rlcurate.models.warmstart``: the same as ``rlcurate warmstart`` (chapter 4)."""

import sys

from rlcurate.cli import main as _cli

if __name__ == "__main__":  # through the command line, so that a user's mistake is one line
    raise SystemExit(_cli(["warmstart", *sys.argv[1:]]))
