"""``python -m rlcurate.audit``: the same as ``rlcurate audit``."""

import sys

from rlcurate.cli import main

raise SystemExit(main(["audit", *sys.argv[1:]]))
