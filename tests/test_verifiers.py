"""Verifiers for GSM8K, MATH and Countdown: known cases, real gold solutions, threads, and
property tests that arbitrary text never raises."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcurate.tasks.base import Reward
from rlcurate.tasks.countdown import solve_countdown
from rlcurate.tasks.verifiers import (
    countdown_reward,
    evaluate_arithmetic,
    extract_answer_tag,
    extract_boxed,
    extract_gsm8k_answer,
    gsm8k_reward,
    math_reward,
    normalize_math_answer,
    parse_number,
)

PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# GSM8K
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, value",
    [
        ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "18", 1.0),
        ("The answer is #### 1,080.", "1080", 1.0),
        ("She pays $1,080.00 in total.", "1080", 1.0),
        ("so she pays $18.", "18", 1.0),
        ("#### -5", "-5", 1.0),
        ("The temperature drops to -5 degrees.", "-5", 1.0),
        ("5-3=2 apples", "2", 1.0),
        ("it costs 2.50 dollars", "2.5", 1.0),
        ("It is 50% of the total.", "50", 1.0),
        ("#### 17\nWait, maybe 18.", "18", 0.0),  # the marker wins over a later number
        ("The answer is \\boxed{42}. Check: 3 steps", "42", 1.0),
        ("Total 12, remainder 7", "12", 0.0),
        ("no number at all", "3", 0.0),
        ("", "3", 0.0),
        ("#### ", "3", 0.0),
        ("1" * 500, "1", 0.0),
    ],
)
def test_gsm8k_reward_cases(completion, gold, value):
    reward = gsm8k_reward(completion, gold)
    assert isinstance(reward, Reward)
    assert reward.value == value, reward.reason
    assert reward.reason


def test_gsm8k_require_marker():
    assert gsm8k_reward("so 18", "18").value == 1.0
    strict = gsm8k_reward("so 18", "18", require_marker=True)
    assert strict.value == 0.0 and "####" in strict.reason
    assert gsm8k_reward("so\n#### 18", "18", require_marker=True).value == 1.0


def test_gsm8k_helpers():
    assert parse_number("1,234.50") == Fraction(246_9, 2)
    assert parse_number("$18.") == 18 and parse_number("-7") == -7 and parse_number("x7") is None
    assert extract_gsm8k_answer("a 1 b 2 #### 3 then 4") == ("3", "after ####")
    assert extract_gsm8k_answer("nothing")[0] is None


def test_gsm8k_bad_gold_raises():
    with pytest.raises(ValueError, match="gold"):
        gsm8k_reward("#### 3", "three")


def test_gsm8k_real_solutions_score_one(shared_data):
    rows = [json.loads(line) for line in (shared_data / "gsm8k" / "test.jsonl").open()]
    for row in rows:
        gold = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert gsm8k_reward(row["answer"], gold).value == 1.0, row["answer"]


# ---------------------------------------------------------------------------------------------
# MATH
# ---------------------------------------------------------------------------------------------


def test_extract_boxed():
    assert extract_boxed(r"so \boxed{\frac{1}{2}} and") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{1} then \boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert extract_boxed(r"\fbox{7}") == "7"
    assert extract_boxed(r"\boxed 5.") == "5"
    assert extract_boxed(r"\boxed{1} and \boxed{2") == "1"  # the unclosed last box is skipped
    assert extract_boxed("no box") is None and extract_boxed(r"\boxed{") is None


def test_normalize_math_answer():
    assert normalize_math_answer(r"\dfrac{1}{2}") == normalize_math_answer(r"\frac{1}{2}")
    assert normalize_math_answer(r"\left( 3, \frac{\pi}{2} \right)") == r"(3,\frac{\pi}{2})"
    assert normalize_math_answer(r"90^\circ") == "90" and normalize_math_answer(r"\text{(A)}") == "(A)"


@pytest.mark.parametrize(
    "completion, gold, value",
    [
        (r"The answer is $\boxed{\frac{1}{2}}$.", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac12", 1.0),
        (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
        (r"\boxed{90^\circ}", "90", 1.0),
        ("so x = 46", "46", 1.0),
        (r"\boxed{47}", "46", 0.0),
        (r"\boxed{x", "5", 0.0),
        ("garbage {{{ $$ \\frac{", "5", 0.0),
        ("", "5", 0.0),
    ],
)
def test_math_reward_cases(completion, gold, value):
    reward = math_reward(completion, gold)
    assert reward.value == value, reward.reason


def test_math_reward_in_threads():
    cases = [(r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0), (r"\boxed{0.25}", r"\frac{1}{4}", 1.0),
             (r"\boxed{3}", "4", 0.0), ("plain words", "7", 0.0)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: math_reward(c[0], c[1]), cases * 3))
    assert [r.value for r in results] == [c[2] for c in cases] * 3
    assert not any("thread" in r.reason for r in results)


def test_math_bad_gold_raises():
    with pytest.raises(ValueError, match="gold"):
        math_reward(r"\boxed{1}", "")


def test_math500_solutions_score_one(shared_data):
    rows = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").open()]
    for row in rows:
        assert math_reward(row["solution"], row["answer"]).value == 1.0, row["unique_id"]


# ---------------------------------------------------------------------------------------------
# Countdown
# ---------------------------------------------------------------------------------------------
NUMS, TARGET = [96, 7, 37, 74], 55


@pytest.mark.parametrize(
    "completion, value, binary",
    [
        ("<think>...</think><answer> 7 + (96 * 37) / 74 </answer>", 1.0, 1.0),
        ("<answer>7 + 96 * 37 / 74 = 55</answer>", 1.0, 1.0),
        ("<answer>55 = 7 + 96 * 37 / 74</answer>", 1.0, 1.0),
        ("<answer>7 × 1 + 96 × 37 ÷ 74</answer>", 0.1, 0.0),  # uses an extra 1
        ("<answer>7 × (96 × 37 ÷ 74 + 0) </answer>", 0.1, 0.0),
        ("<answer> (96 - 74) + 37 - 7 </answer>", 0.1, 0.0),  # = 52
        ("<answer>96 + 7</answer>", 0.1, 0.0),  # misses numbers
        ("<answer>96 + 96 + 37 - 74 - 7</answer>", 0.1, 0.0),  # reuses a number
        ("<answer>__import__('os').system('ls')</answer>", 0.1, 0.0),
        ("<answer>9**99999</answer>", 0.1, 0.0),
        ("<answer>-96 + 74 + 37 + 7 + 33</answer>", 0.1, 0.0),  # unary minus
        ("<answer>96.0 - 74 + 37 - 7</answer>", 0.1, 0.0),
        ("<answer>96 / (74 - 74) + 7 + 37</answer>", 0.1, 0.0),
        ("<answer>" + "(" * 150 + "1" + ")" * 150 + "</answer>", 0.1, 0.0),
        ("<answer></answer>", 0.1, 0.0),
        ("no tag: 7 + 96 * 37 / 74", 0.0, 0.0),
        ("<answer>1</answer> then <answer>7 + 96 * 37 / 74</answer>", 1.0, 1.0),  # the last tag counts
    ],
)
def test_countdown_reward_cases(completion, value, binary):
    assert countdown_reward(completion, NUMS, TARGET, format_score=0.1).value == value
    assert countdown_reward(completion, NUMS, TARGET).value == binary


def test_evaluate_arithmetic_is_exact():
    assert evaluate_arithmetic("7 / 2 * 2") == (Fraction(7), [7, 2, 2])
    assert evaluate_arithmetic("(1 + 2) / 3")[0] == 1
    for bad in ["2 ** 3", "2 // 3", "-1 + 2", "x + 1", "1e3", "1234567 + 1", "1 +", "", "()", "1 < 2"]:
        with pytest.raises(ValueError):
            evaluate_arithmetic(bad)


def test_countdown_bad_arguments_raise():
    with pytest.raises(ValueError, match="format_score"):
        countdown_reward("<answer>1</answer>", [1], 1, format_score=1.5)
    with pytest.raises(ValueError, match="numbers"):
        countdown_reward("<answer>1</answer>", "12", 1)
    with pytest.raises(ValueError, match="target"):
        countdown_reward("<answer>1</answer>", [1], 1.5)


def test_extract_answer_tag():
    assert extract_answer_tag("<answer> 1 + 2 </answer>") == "1 + 2"
    assert extract_answer_tag("<ANSWER>3</ANSWER>") == "3"
    assert extract_answer_tag("<answer>3") is None


def test_solver_solutions_score_one(shared_data):
    rows = [json.loads(line) for line in (shared_data / "countdown" / "test.jsonl").open()][:200]
    solved = 0
    for row in rows:
        expr = solve_countdown(row["nums"], row["target"])
        if expr is not None:
            solved += 1
            assert countdown_reward(f"<answer>{expr}</answer>", row["nums"], row["target"]).value == 1.0, expr
    assert solved >= 150  # most TinyZero puzzles are solvable


# ---------------------------------------------------------------------------------------------
# Property tests: model text never makes a verifier raise
# ---------------------------------------------------------------------------------------------
_PIECES = list("0123456789+-*/=().,$ {}\\^_abcdefxyz#%<>") + [
    r"\boxed{", r"\frac{", "####", "<answer>", "</answer>", r"\sqrt", r"\pi", "\n", "1,000", "-", "."
]
LATEXISH = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)
ANY_TEXT = st.one_of(st.text(max_size=200), LATEXISH)


@PROPERTY
@given(text=ANY_TEXT)
def test_gsm8k_never_raises(text):
    reward = gsm8k_reward(text, "18")
    assert reward.value in (0.0, 1.0)
    assert "verifier error" not in reward.reason  # no exception was swallowed either


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(text=ANY_TEXT)
def test_math_never_raises(text):
    reward = math_reward(text, r"\frac{1}{2}")
    assert reward.value in (0.0, 1.0)
    assert "verifier error" not in reward.reason


@PROPERTY
@given(text=ANY_TEXT)
def test_countdown_never_raises(text):
    for completion in (text, f"<answer>{text}</answer>"):
        reward = countdown_reward(completion, NUMS, TARGET, format_score=0.1)
        assert reward.value in (0.0, 0.1, 1.0)
        assert "verifier error" not in reward.reason


@st.composite
def expressions(draw):
    """A random expression tree over random integers, with its exact value (or None on x/0)."""
    numbers = draw(st.lists(st.integers(0, 100), min_size=2, max_size=5))
    items = [(Fraction(n), str(n)) for n in numbers]
    while len(items) > 1:
        i = draw(st.integers(0, len(items) - 2))
        (a, ea), (b, eb) = items[i], items[i + 1]
        op = draw(st.sampled_from("+-*/"))
        if op == "/" and b == 0:
            return numbers, None, f"({ea} / {eb})"
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
        items[i : i + 2] = [(value, f"({ea} {op} {eb})")]
    return numbers, items[0][0], items[0][1]


@PROPERTY
@given(case=expressions())
def test_countdown_agrees_with_exact_arithmetic(case):
    numbers, value, expr = case
    if value is None:
        assert countdown_reward(f"<answer>{expr}</answer>", numbers, 0).value == 0.0
        return
    assert evaluate_arithmetic(expr)[0] == value
    if value.denominator == 1:
        shuffled = list(reversed(numbers))
        assert countdown_reward(f"<answer>{expr}</answer>", shuffled, int(value)).value == 1.0
        assert countdown_reward(f"<answer>{expr}</answer>", shuffled, int(value) + 1).value == 0.0


@pytest.mark.parametrize("text", [
    "\\boxed{" * 20_000, "\\boxed{1" + "{" * 50_000, "<answer>" * 20_000 + "</answer>" * 3, "1," * 30_000,
    "#### " + "9" * 50_000, "<answer>" + "(1+" * 3000 + "</answer>",
])
def test_degenerate_long_completions_are_fast(text):
    t0 = time.perf_counter()
    assert gsm8k_reward(text, "1").value in (0.0, 1.0)
    assert math_reward(text, "1").value in (0.0, 1.0)
    assert countdown_reward(text, [1, 2], 3).value in (0.0, 1.0)
    assert time.perf_counter() - t0 < 5


def test_non_string_completions_score_zero():
    for bad in (None, 3, b"#### 18", ["#### 18"]):
        assert gsm8k_reward(bad, "18").value == 0.0
        assert math_reward(bad, "18").value == 0.0
        assert countdown_reward(bad, [1, 2], 3).value == 0.0
