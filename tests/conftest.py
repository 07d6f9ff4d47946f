"""Fixtures shared by several test modules (the root conftest.py sets up the environment)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module: the tiny model is faster on one thread on a busy 2-core CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model_and_tokenizer():
    """The tiny Qwen2 model (random weights, seed 0) in eval mode and its tokenizer."""
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

    torch.manual_seed(0)
    return build_tiny_model(seed=0).eval(), build_tiny_tokenizer()


@pytest.fixture(scope="module")
def spread_policy():
    """(model, tokenizer, task) for curation smoke runs: the committed `spread` checkpoint (random tiny
    weights where it is missing) and 2- and 3-digit additions."""
    from rlcurate.tasks.arithmetic import ArithmeticTask

    spread = REPO / "data" / "tiny" / "spread"
    if spread.exists():
        from rlcurate.models import load_policy

        model, tok = load_policy(str(spread), device="cpu", dtype="fp32")
    else:
        from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer

        model, tok = build_tiny_model(seed=0), build_tiny_tokenizer()
    threads = torch.get_num_threads()  # the smoke runs use threads=1 (much faster on a busy 2-core CPU)
    yield model, tok, ArithmeticTask(levels=["add2", "add3"], n_train=64, n_test=8)
    torch.set_num_threads(threads)


@pytest.fixture
def resume_identical():
    """``check(world, make, steps, split, **SimTrainer options)``: a simulated run of ``steps`` steps equals one
    stopped after ``split`` steps and resumed from the curator's state as a checkpoint stores it (JSON), with the
    parameters carried over; returns the first trainer and the full run's records."""
    import json

    from rlcurate.sim.bridge import SimTrainer

    def check(world, make, steps=10, split=5, **kw):
        full = SimTrainer(world, make(), **kw).run(steps).records[1:]
        a = SimTrainer(world, make(), **kw)
        first = a.run(split).records[1:]
        state = json.loads(json.dumps(a.curator.state_dict()))
        b = SimTrainer(world, make(), theta=a.theta, **kw)
        b.curator.load_state_dict(state)
        b.step, b.rollouts = a.step, a.rollouts
        assert first + [b.train_step() for _ in range(steps - split)] == full
        return a, full

    return check
