"""Checks on the values recorded by book/11_when_curation_pays.ipynb (run in the smoke profile)."""


def check(records):
    # the premise of the oracle's ranking: GRPO's mean group update is w_G(p) grad p, |grad p| within its bound
    for row in records["signal_check"]:
        assert row["rel_err"] < 0.15 and row["grad_norm_over_bound"] <= 1 + 1e-9, row
    the_map = records["map"]
    assert set(the_map) == {"main", "hard"}  # the smoke profile's reduced suite
    for cond, table in the_map.items():
        assert "uniform" not in table and {"uniform_aa", "oracle_select", "oracle_alloc"} <= set(table), cond
        aa = table["uniform_aa"]
        assert aa["low"] <= 1 <= aa["high"], cond  # the A/A control covers a ratio of 1
        for arm, r in table.items():
            assert r["low"] <= r["ratio"] <= r["high"] and 0 <= r["p_holm"] <= 1 and r["n"] == 3, (cond, arm)
            assert r["saving_bound"] < 1 and 0 <= r["censored"] <= 3, (cond, arm)
