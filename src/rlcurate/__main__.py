"""``python -m rlcurate``: the same as the ``rlcurate`` command."""

from rlcurate.cli import main

raise SystemExit(main())
