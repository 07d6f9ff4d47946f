"""Checks on the values the committed chapters hold (their cpu-profile outputs, as stored in book/).

tests/test_notebooks.py runs each chapter in the smoke profile, where the reduced suites leave out what
the text reports from the full runs; the numbers the text quotes from those runs are checked here, on the
records stored in the committed notebooks (read, not executed: seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcurate.book import read_records

REPO = Path(__file__).resolve().parents[1]


def committed(stem: str) -> dict:
    records = read_records(REPO / "book" / f"{stem}.ipynb")
    assert records.get("profile") == "cpu", f"book/{stem}.ipynb is stored in profile {records.get('profile')!r}"
    return records


@pytest.fixture(scope="module")
def ch11() -> dict:
    return committed("11_when_curation_pays")


def test_ch11_knapsack_crossing_is_uniforms_at_every_group_size(ch11):
    # Knapsack-RL's crossing is uniform's on every seed at G = 2 (nothing to move), on all but one at G = 4 and 16
    same = ch11["knapsack_same_crossing"]
    assert {c: same.get(c) for c in ("g2", "g4", "g16")} == {"g2": 16, "g4": 15, "g16": 15}, same


def test_ch11_ten_rates_chosen_at_an_end_of_the_grid(ch11):
    # the text counts the rates chosen at an end of the grid, not extended: 10 of 130 in the committed map
    assert sum(len(v) for v in ch11["edge_rates"].values()) == 10, ch11["edge_rates"]


@pytest.mark.parametrize("label", ["tiny", "tiny_hard", "tiny_group"])
def test_ch11_tiny_model_tables_are_well_formed(ch11, label):
    # the tiny model's tables (the same committed runs in every profile): each ratio inside its interval
    table = ch11[label]
    assert table
    for arm, r in table.items():
        assert r["low"] <= r["ratio"] <= r["high"] and 0 <= r["p_holm"] <= 1, (label, arm, r)


def test_ch09_uniform_solves_the_world_within_its_first_pass():
    # the text's reading of the tuned runs: at the tuned step uniform solves the world (0.99 held out) within its
    # first pass over the pool, before selection can act
    uni = committed("09_insight")["sim_tuned"]["uniform"]
    assert uni["solved_at"] and uni["one_pass_steps"] > 0, uni
    assert all(s is not None and s < uni["one_pass_steps"] for s in uni["solved_at"]), uni
