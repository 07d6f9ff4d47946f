"""``python -m rlcurate.audit``: the same as ``rlcurate audit``."""

from rlcurate.audit.cli import main

raise SystemExit(main())
