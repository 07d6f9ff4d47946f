"""Checks on the values recorded by book/10_end_to_end.ipynb (run in the smoke profile)."""


def check(records):
    ci = records["ci_check"]
    assert abs(ci["median_ratio"] - 0.5) < 0.08 and ci["coverage"] > 0.5
    sim = records["sim"]
    assert sim["uniform"]["ratio"] == 1.0 and sim["uniform"]["diff"] == 0.0
    tiny = records["tiny"]
    assert tiny["uniform"]["ratio"] == 1.0 and tiny["uniform"]["seeds"] == 3
    for name, row in tiny.items():
        assert 0 < row["final"] < 1 and 0 <= row["mixed"] <= 1, name
        if row["ratio"] is not None:
            assert row["ratio_lo"] is None or row["ratio_lo"] <= row["ratio"] + 1e-9, name
    live = records["live"]
    assert live["uniform"]["rollouts"] == live["uniform"]["steps"] * 4 * 8
