"""Run profiles: ``smoke`` (tests, seconds), ``cpu`` (the rendered book, minutes), ``gpu`` (real
checkpoints on a GPU box)."""

from __future__ import annotations

import os

PROFILES = ("smoke", "cpu", "gpu")
ENV_VAR = "RLCURATE_PROFILE"


def profile(default: str = "cpu") -> str:
    """The active profile from ``RLCURATE_PROFILE`` (``default`` when unset)."""
    value = os.environ.get(ENV_VAR, default).strip().lower() or default
    if value not in PROFILES:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(PROFILES)}, got {value!r}")
    return value


def by_profile(active: str, *, smoke, cpu, gpu=None):
    """Pick the value for the ``active`` profile; ``gpu`` defaults to the ``cpu`` value."""
    if active not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {active!r}")
    return {"smoke": smoke, "cpu": cpu, "gpu": cpu if gpu is None else gpu}[active]


def gpu_cells(active: str) -> bool:
    """Whether a chapter runs its GPU cells: in the ``gpu`` profile, or in a dry run (``RLCURATE_DRYRUN=1``,
    :mod:`rlcurate.dryrun`), where they run at the sizes of the active profile on random-weight models."""
    from rlcurate.models.dry_run import dry_run_active

    return active == "gpu" or dry_run_active()
