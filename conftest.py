"""Shared test set-up: real datasets from ../shared/data, a quiet non-interactive matplotlib, and
two CPU threads (the machines this project is tested on have two cores)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("RLCURATE_DATA_DIR", str(SHARED_DATA))
os.environ.setdefault("RLCURATE_PROFILE", "smoke")  # nbval executes the chapters in this profile
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


def pytest_configure(config):
    try:
        import torch

        torch.set_num_threads(2)
    except ImportError:  # the statistics core is usable without torch
        pass
