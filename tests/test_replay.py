"""The numbers do not move (issues #14 and #26): the first steps of the committed reference runs, re-run
with the code as it is now, give the stored metrics, on any processor.

Each committed run has a replay fixture (``tests/replays``, made by ``scripts/record_replays.py``) that
holds the sampled tokens of its first steps. The replay is teacher-forced (``rlcurate.replay``): the
current code scores and trains on the recorded tokens, so a token that another processor's rounding
would flip at a near-tie cannot send the run elsewhere. Counts must match exactly; floats to the
tolerances measured across kernel paths (``rlcurate.replay.TOLERANCES``). The sampler is checked token
by token on the side. Where this machine runs the recording's kernels, the sampled steps must also come
back bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcurate.provenance import kernel_signature
from rlcurate.replay import compare_steps, forced_replay, load_fixture

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "data" / "runs"
FIXTURES = sorted((REPO / "tests" / "replays").glob("*/*.json.gz"))
IDS = [f"{p.parent.name}/{p.name.removesuffix('.json.gz')}" for p in FIXTURES]
# SmolLM2 runs whose code paths another SmolLM2 fixture replays (scripts/record_replays.py says which)
COVERED_BY_OTHERS = {"smollm2_protocol/uniform_aa_s0", "smollm2_protocol/insight_s0", "smollm2_revisit/uniform_s0",
                     "smollm2_revisit/uniform_aa_s0", "smollm2_revisit/insight_s0", "smollm2_revisit/combined_s0"}
# SmolLM2's DAPO and Ada-Seq: their sampling rounds are the same code on every model, replayed by protocol's tiny
# fixtures; SmolLM2's model, chat format and update by its uniform and combined fixtures
COVERED_BY_OTHERS |= {"smollm2_protocol/dapo_s0", "smollm2_protocol/ada_seq_n4_s0"}
# chapter 11's tiny-model suite repeats these chapter 10 runs (same configuration and seed; only the evaluation grid
# differs, which the first steps do not reach): protocol's fixtures replay them
COVERED_BY_OTHERS |= {f"curation_pays/{arm}_s0" for arm in ("uniform", "uniform_aa", "insight", "ada_est_hybrid", "dapo",
                                                            "uniform_g16")}
# the group-size suite repeats the main suite's uniform run; the hard pool's other arms take code paths the main
# suite's fixtures replay (its own fixtures: uniform, for the pool's levels, and GRESO, whose skips depend on it)
COVERED_BY_OTHERS |= {"curation_pays_group/uniform_s0"}
COVERED_BY_OTHERS |= {f"curation_pays_hard/{arm}_s0" for arm in ("uniform_aa", "oracle_select", "oracle_alloc", "insight",
                                                                 "dapo")}
# chapter 10's hinting arms: uniform repeats protocol's run; SAGE's and SAGE-LIGHT's paths are replayed by end_to_end's
# fixtures, the recipe with hinted failures counted by smollm2_revisit's
COVERED_BY_OTHERS |= {f"protocol_hints/{arm}_s0" for arm in ("uniform", "sage", "sage_light", "combined_failures")}
# the cost currencies' suite repeats protocol's arms with a larger max_rollouts (which the first steps do not reach):
# protocol's fixtures replay them
COVERED_BY_OTHERS |= {f"protocol_cost/{arm}_s0" for arm in ("uniform", "uniform_aa", "dapo", "ada_seq_n4", "ada_seq_n8",
                                                           "ada_est_hybrid", "ada_est_prototype", "combined")}
# chapter 10's dense currency across rho repeats protocol's arms with a larger max_rollouts (bit for bit up to 12,800
# rollouts): protocol's fixtures replay them
COVERED_BY_OTHERS |= {f"protocol_rho/{arm}_s0" for arm in ("uniform", "uniform_aa", "uniform_order2_aa", "dapo",
                                                          "ada_seq_n4", "ada_seq_n8")}
# SmolLM2 at twice the budget repeats smollm2_protocol's arms (a larger max_rollouts, a coarser grid, more samples per
# evaluation prompt; the training steps are the same): smollm2_protocol's fixtures replay uniform (DAPO as above), and
# INSIGHT's selection is replayed by the combined recipe's fixture (the same selector, no hint rolled at 0.66 visits)
COVERED_BY_OTHERS |= {f"smollm2_long/{arm}_s0" for arm in ("uniform", "uniform_aa", "insight", "dapo")}
# the revisited pool's arms at the rate tuned on it repeat smollm2_revisit's with another learning rate, which a
# SmolLM2 fixture's one replayed step (selection, sampling rounds, hints; no update for these arms) does not reach:
# smollm2_revisit's fixtures (combined, combined_failures) replay them
COVERED_BY_OTHERS |= {f"smollm2_revisit_tuned/{arm}_s0" for arm in ("insight", "combined", "combined_failures")}
# the precise re-measurement trains as smollm2_revisit (uniform, A/A) and smollm2_revisit_tuned (the rest) do and draws
# more samples per evaluation prompt, which the replayed steps do not reach: their fixtures replay it
COVERED_BY_OTHERS |= {f"smollm2_revisit_precise/{arm}_s0" for arm in ("uniform", "uniform_aa", "insight", "combined",
                                                                    "combined_failures")}


def keeps_state(config: dict) -> bool:
    """Whether the run's strategy carries anything from one step to the next besides its selector's place in the
    pass over the pool: its :meth:`~rlcurate.curation.Curator.state_dict` (what a resumed run needs) holds more."""
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Selector

    state = build_curator(config["strategy"], **(config.get("strategy_kwargs") or {})).state_dict()
    place = {k: v for k, v in state["selector"].items() if k not in Selector().state_dict()}
    return any([place, state["sampler"], *state["processors"]])


def replay_steps(fixture: dict) -> int:
    """How many of the fixture's recorded steps to replay. SmolLM2's step is a 135M-parameter update on a CPU: its
    fixtures replay their first step (the strategy's selection, sampling rounds, hints, scoring and loss); the next
    steps' numbers after the optimizer's update are checked by the tiny-model fixtures (the same update code on
    another architecture), and that a SmolLM2 step moves its weights by tests/test_train_smollm2.py. A tiny-model
    fixture whose strategy keeps no state across steps (:func:`keeps_state`: uniform GRPO, Reinforce-Ada-Seq, DAPO,
    DRO, GVM, SAGE) replays two: its third step runs the second's code again after one more optimizer update, which
    the fixtures of the strategies that keep state (their selection or sampling depends on every earlier step)
    replay in all three steps."""
    if fixture["config"]["model"] == "smollm2":
        return 1
    if not keeps_state(fixture["config"]):
        return min(2, fixture["steps"])
    return fixture["steps"]


def _replay_and_compare(path: Path, scratch: Path, threads: int | None = None) -> None:
    """Replay ``path`` on ``threads`` torch threads (default: this process's, two, or one in a pytest-xdist worker
    (conftest.py); the recordings ran on one) and compare its steps with the recorded ones."""
    import torch

    threads = threads or torch.get_num_threads()
    fixture = load_fixture(path)
    steps = replay_steps(fixture)
    metrics, check = forced_replay(fixture, scratch, threads=threads, steps=steps)
    assert not list(Path(scratch).rglob("state.pt")), "a replay writes no checkpoint (nothing resumes it)"
    problems = compare_steps([r for r in fixture["forced"] if r["step"] <= steps], metrics)
    assert not problems, f"{path.name}: {problems[:5]}"
    assert not check.mismatches, f"{path.name}: the sampler picks other tokens: {check.mismatches[:5]}"
    # a near-tie is a token that rounding decides; more than one in a thousand is a shifted sampler
    assert len(check.near_ties) <= max(2, check.tokens // 1000), f"{path.name}: near-ties {check.near_ties}"


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_a_committed_run_replays_teacher_forced(path, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # configs name the model folder relative to the repository
    _replay_and_compare(path, tmp_path)


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_a_fixture_is_its_committed_run(path):
    """The fixture's sampled steps are the committed run's (the link from the replay to the book's numbers)."""
    fixture = load_fixture(path)
    result = json.loads((RUNS / fixture["suite"] / f"{fixture['run']}_s{fixture['seed']}.json").read_text())
    assert fixture["config"] == result["config"]
    stored = [r for r in result["metrics"] if 1 <= r["step"] <= fixture["steps"]]
    assert len(stored) == fixture["steps"]
    assert not compare_steps(stored, fixture["sampled"], keys_of="stored")


def test_every_committed_run_has_a_fixture():
    have = set(IDS)
    runs = {f"{p.parent.name}/{p.stem}" for p in RUNS.glob("*/*_s0.json")}
    assert runs - have - COVERED_BY_OTHERS == set()
    assert COVERED_BY_OTHERS <= runs


def test_a_moved_number_is_reported(tmp_path, monkeypatch):
    """The comparison can fail: a fixture's stored loss and a recorded token changed by hand are reported."""
    monkeypatch.chdir(REPO)
    fixture = load_fixture(REPO / "tests" / "replays" / "end_to_end" / "uniform_s0.json.gz")
    fixture["forced"][0]["grad_norm"] *= 1.001
    fixture["forced"][1]["rollouts"] += 1
    toks = fixture["calls"][0]["tokens"][0][0]
    toks[0] = (toks[0] + 1) % 20  # another token where the sampler was not near a tie
    metrics, check = forced_replay(fixture, tmp_path)
    problems = compare_steps(fixture["forced"], metrics)
    assert any("step 1 grad_norm" in p for p in problems)
    assert any("step 2 rollouts" in p for p in problems)
    assert (0, 0, 0, 0) in [(k, i, j, t) for k, i, j, t, _ in check.mismatches]


def _kernels_match(fixture: dict) -> bool:
    here = kernel_signature()
    there = fixture["recorded_on"]["kernels"]
    keys = ("vendor", "isa", "env", "aten_capability")
    return all(here.get(k) == there.get(k) for k in keys)


BIT_EXACT = ("protocol/uniform_s0", "end_to_end/ada_seq_balanced_s0")


@pytest.mark.slow
@pytest.mark.parametrize("name", BIT_EXACT)
def test_sampled_steps_are_bit_exact_on_the_recording_kernels(name, tmp_path, monkeypatch):
    """On a machine whose kernel signature is the recording's, the sampled steps come back bit for bit."""
    from rlcurate.replay import _replay_config, _train
    from rlcurate.rollout.forced import RecordingEngine

    monkeypatch.chdir(REPO)
    fixture = load_fixture(REPO / "tests" / "replays" / f"{name}.json.gz")
    if not _kernels_match(fixture):
        pytest.skip(f"recorded on other kernels ({fixture['recorded_on']['cpu']})")
    config = _replay_config(fixture, fixture["steps"], tmp_path, None)
    sampled, recorder = _train(config, RecordingEngine)
    assert recorder.calls == fixture["calls"]
    assert sampled == fixture["sampled"]


EMULATED = ("protocol/uniform_s0", "end_to_end/dapo_s0", "end_to_end/sage_s0", "smollm2_protocol/combined_s0")


@pytest.mark.slow
def test_replays_hold_on_another_kernel_path(tmp_path):
    """CI on any machine exercises two kernel paths: a few replays again in a process whose ATen, MKL and
    oneDNN kernels are held to another instruction set (AVX2 on an AVX-512 machine or under the portable
    default, the portable default on an AVX2 one)."""
    import torch

    own = torch.backends.cpu.get_cpu_capability().lower()
    other = "default" if own == "avx2" else "avx2"  # from AVX-512 or from the portable default (run under ATEN_CPU_CAPABILITY=default)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": other, "MKL_ENABLE_INSTRUCTIONS": "AVX2",
           "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = "\n".join([
        "import sys, torch",
        "from pathlib import Path",
        "sys.path.insert(0, 'tests')",
        "from test_replay import _replay_and_compare",
        f"assert torch.backends.cpu.get_cpu_capability().lower() == {other!r}, torch.backends.cpu.get_cpu_capability()",
        f"for name in {EMULATED!r}:",
        f"    _replay_and_compare(Path('tests/replays') / (name + '.json.gz'), Path({str(tmp_path)!r}) / name)",
    ])
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_strategy_that_keeps_state_replays_every_recorded_step():
    """A tiny-model fixture replays two of its three steps only where its strategy keeps no state across steps."""
    assert not keeps_state({"strategy": "uniform"}) and not keeps_state({"strategy": "dapo"})
    assert keeps_state({"strategy": "insight"}) and keeps_state({"strategy": "sage_light"})
    assert keeps_state({"strategy": "ada_est"}) and keeps_state({"strategy": "greso"})
    fixture = load_fixture(REPO / "tests" / "replays" / "end_to_end" / "insight_s0.json.gz")
    assert fixture["steps"] == 3 and replay_steps(fixture) == 3
    fixture = load_fixture(REPO / "tests" / "replays" / "end_to_end" / "uniform_s0.json.gz")
    assert replay_steps(fixture) == 2
