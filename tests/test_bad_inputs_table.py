"""tests/BAD_INPUTS.md lists the bad inputs a user may give and the test that pins each one down
(issue #12); every test it names must exist, so the table cannot drift from the suite."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_named_in_the_bad_inputs_table_exists():
    defined = set()
    for f in TESTS.glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", f.read_text(), flags=re.M))
    rows = [r for r in (TESTS / "BAD_INPUTS.md").read_text().splitlines() if re.match(r"\| ?[A-Z]?\d+ ", r)]
    assert len(rows) >= 40
    named = {n for r in rows for n in re.findall(r"\b(test_\w+)", r)} - {f.stem for f in TESTS.glob("test_*.py")}
    assert named, "the table names no test"
    assert not named - defined, f"tests named in BAD_INPUTS.md that do not exist: {sorted(named - defined)}"


def test_the_counts_section_matches_the_rows():
    """The table's closing counts by verdict (issue #30) are those of its rows."""
    import collections

    text = (TESTS / "BAD_INPUTS.md").read_text()
    rows = [r for r in text.splitlines() if re.match(r"\| ?[A-Z]?\d+ ", r)]
    counts = collections.Counter(re.split(r"(?<!\\)\|", r.strip().strip("|"))[3].split()[0].rstrip(",;") for r in rows)
    assert set(counts) <= {"refused", "handled", "warned", "stopped"}, counts
    stated = text[text.index("## Counts"):]
    assert f"{len(rows)} bad inputs: {counts['refused']} refused" in stated
    assert f"{counts['handled']} handled" in stated and f"{counts['warned']} warned" in stated
    assert f"{counts['stopped']} stopped" in stated
