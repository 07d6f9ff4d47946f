"""Checks on the values recorded by book/A3_pretrained.ipynb (run in the smoke profile)."""


def check(records):
    audit = records["audit"]
    levels = audit["levels"]
    assert set(levels) >= {"add1", "add2", "sub1", "sub2", "mul1", "mul2x1"}
    for lv, row in levels.items():
        assert row["prompts"] > 0 and 0 <= row["mean"] <= 1
        assert abs(row["mixed"] + row["right"] + row["wrong"] - 1) < 1e-9, lv
    assert audit["chosen_mixed"] >= 0.2
    comp = records["comparison"]
    assert comp["planned"] == {"smollm2_lr": 30, "smollm2_protocol": 48}
    assert all(0 <= comp["finished"][k] <= comp["planned"][k] for k in comp["planned"])
    # no table is read from a partial suite
    assert (comp["table"] is None) == (comp["finished"]["smollm2_protocol"] < comp["planned"]["smollm2_protocol"])
