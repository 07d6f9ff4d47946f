"""Real datasets as tasks: counts, stable uids, solution steps, prompts with hints, malformed rows,
the parquet and Hub code paths, and the registry."""

from __future__ import annotations

import json
import re

import pytest

from rlcurate.tasks import datasets as ds
from rlcurate.tasks.base import Problem, Reward
from rlcurate.tasks.countdown import Countdown
from rlcurate.tasks.datasets import DatasetFormatError, DatasetUnavailableError, HubSpec, with_hint
from rlcurate.tasks.gsm8k import GSM8K, parse_gsm8k_solution
from rlcurate.tasks.math import MATH, MATH500, MATHLevel3to5, split_solution
from rlcurate.tasks.registry import available_tasks, get_task, register_task
from rlcurate.tasks.verifiers import gsm8k_reward, math_reward

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def qwen_tokenizer(shared_data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared_data / "qwen2.5-tokenizer")
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def tasks(shared_data):
    """One instance per task, so each split is parsed once for the whole module."""
    names = ("gsm8k", "math500", "math_l3to5", "math", "countdown")
    return {name: get_task(name, data_dir=shared_data) for name in names}


# ---------------------------------------------------------------------------------------------
# The real files
# ---------------------------------------------------------------------------------------------
COUNTS = [
    ("gsm8k", "train", 7473), ("gsm8k", "test", 1319), ("math500", "test", 500),
    ("math_l3to5", "train", 8521), ("math", "train", 8521), ("math", "test", 500),
    ("countdown", "train", 8001), ("countdown", "test", 2001),
]


@pytest.mark.parametrize("name, split, count", COUNTS)
def test_counts_and_unique_uids(tasks, name, split, count):
    problems = tasks[name].problems(split)
    assert len(problems) == count
    assert len({p.uid for p in problems}) == count
    assert all(isinstance(p, Problem) and p.question and p.answer for p in problems)
    assert all(p.meta["line"] >= 1 and p.meta["split"] == split for p in problems)


def test_math_l3to5_skips_rows_without_answer(tasks):
    task = tasks["math_l3to5"]
    task.problems("train")
    assert len(task.skipped["train"]) == 2  # lines 5055 and 5159 have an empty answer
    assert "line 5055" in task.skipped["train"][0] and "'answer'" in task.skipped["train"][0]
    assert {p.meta["level"] for p in task.problems("train")} == {3, 4, 5}


def test_uids_are_stable(shared_data, tasks):
    again = GSM8K(shared_data).problems("test")
    assert [p.uid for p in again] == [p.uid for p in tasks["gsm8k"].problems("test")]
    assert again == tasks["gsm8k"].problems("test")  # frozen dataclasses: equal content


def test_gsm8k_problem(tasks):
    p = tasks["gsm8k"].problems("test")[0]
    assert p.uid == "gsm8k/test/0" and p.answer == "18"
    assert p.question.startswith("Janet") and p.meta == {
        "source": "gsm8k/test.jsonl", "line": 1, "split": "test", "n_steps": 2}
    assert p.solution[0] == "Janet sells 16 - 3 - 4 = 9 duck eggs a day."  # calculator notes removed
    assert all("<<" not in s and "####" not in s for q in tasks["gsm8k"].problems("train") for s in q.solution)
    answers = [q.answer for q in tasks["gsm8k"].problems("train")]
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", a) for a in answers)  # no thousands separators
    assert "1080" in answers


def test_gsm8k_reveal_gives_hint_text(tasks):
    p = tasks["gsm8k"].problems("test")[0]
    assert p.reveal(1) == p.solution[0] and p.reveal(10) == "\n".join(p.solution)


def test_math500_problem(tasks):
    p = tasks["math500"].problems("test")[0]
    assert p.uid == "math500/test/precalculus/807"
    assert p.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert p.meta["level"] == 2 and p.meta["subject"] == "Precalculus" and p.meta["line"] == 1
    assert p.solution[0] == r"We have that $r = \sqrt{0^2 + 3^2} = 3.$"
    assert any(s.startswith("[asy]") and s.endswith("[/asy]") for s in p.solution)  # one picture, one step
    assert r"\boxed" in p.solution[-1]
    levels = [q.meta["level"] for q in tasks["math500"].problems("test")]
    assert {lv: levels.count(lv) for lv in range(1, 6)} == {1: 43, 2: 90, 3: 105, 4: 128, 5: 134}


def test_math_solution_steps_lose_only_whitespace(shared_data, tasks):
    rows = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").open()]
    for row, p in zip(rows, tasks["math500"].problems("test")):
        assert re.sub(r"\s", "", "".join(p.solution)) == re.sub(r"\s", "", row["solution"])
    lengths = [len(p.solution) for p in tasks["math500"].problems("test")]
    assert sum(n > 1 for n in lengths) > 350  # most solutions split into several steps


def test_split_solution_rules():
    text = "First $x = 1.$ Then we get $y=2$. So 3.5 is it! Done?\n\nNext paragraph, e.g. $a.b$ More."
    assert split_solution(text) == (
        "First $x = 1.$", "Then we get $y=2$.", "So 3.5 is it!", "Done?", "Next paragraph, e.g. $a.b$ More.")


def test_math_combined_task(tasks):
    train, test = tasks["math"].problems("train"), tasks["math"].problems("test")
    assert train[0].uid == tasks["math_l3to5"].problems("train")[0].uid == "math_l3to5/train/0"
    assert test[0].uid == "math500/test/precalculus/807"
    assert not {p.question for p in train} & {p.question for p in test}


def test_math_levels_filter(shared_data):
    hard = MATH500(shared_data, levels=[5]).problems("test")
    assert len(hard) == 134 and all(p.meta["level"] == 5 for p in hard)
    with pytest.raises(ValueError, match="levels"):
        MATH500(shared_data, levels=[7])


def test_countdown_problem(tasks):
    p = tasks["countdown"].problems("test")[0]
    assert p.uid == "countdown/test/0" and p.answer == "55"
    assert p.meta["numbers"] == (96, 7, 37, 74) and p.meta["target"] == 55 and p.meta["n_numbers"] == 4
    assert "[96, 7, 37, 74]" in p.question and "55" in p.question
    n = [q.meta["n_numbers"] for q in tasks["countdown"].problems("train")]
    assert (n.count(3), n.count(4)) == (3926, 4075)


def test_rewards_through_tasks(tasks):
    g = tasks["gsm8k"].problems("test")[0]
    assert tasks["gsm8k"].reward(g, "So she makes 18 dollars.\n#### 18").value == 1.0
    assert tasks["gsm8k"].reward(g, "#### 17").value == 0.0
    assert tasks["gsm8k"].reward(g, None) == Reward(0.0, "completion is NoneType, not str")
    m = tasks["math500"].problems("test")[0]
    assert tasks["math500"].reward(m, r"so $\boxed{(3, \frac{\pi}{2})}$").value == 1.0
    c = tasks["countdown"].problems("test")[0]
    assert tasks["countdown"].reward(c, "<answer>7 + 96 * 37 / 74</answer>").value == 1.0
    graded = Countdown(format_score=0.1)
    assert graded.reward(c, "<answer>96 - 74 + 37 - 7</answer>").value == 0.1


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, split, marker", [
    ("gsm8k", "test", "####"), ("math500", "test", r"\boxed{}"), ("countdown", "test", "<answer>")])
def test_prompts_and_hints(tasks, qwen_tokenizer, name, split, marker):
    task = tasks[name]
    p = task.problems(split)[0]
    text = task.render(p, qwen_tokenizer)
    assert text.startswith("<|im_start|>system\n") and marker in text
    assert p.question in text and text.endswith("<|im_start|>assistant\n")
    assert "hint" not in text
    hinted = task.render(p, qwen_tokenizer, hint="Start from the first step.")
    assert "\n\nHere is a hint to help you:\nStart from the first step.<|im_end|>" in hinted
    assert task.messages(p, hint="") == task.messages(p)
    with pytest.raises(ValueError, match="hint"):
        task.messages(p, hint=3)


def test_system_prompt_and_prefill_options(shared_data, qwen_tokenizer):
    task = GSM8K(shared_data, system_prompt="", prefill="Let me think.")
    p = task.problems("test")[0]
    assert task.messages(p) == [{"role": "user", "content": p.question}]
    assert task.render(p, qwen_tokenizer).endswith("<|im_start|>assistant\nLet me think.")
    with pytest.raises(ValueError, match="system_prompt"):
        GSM8K(shared_data, system_prompt=3)


def test_with_hint():
    assert with_hint("Q", None) == "Q" and with_hint("Q", "  ") == "Q"
    assert with_hint("Q", " use 2 ") == "Question:\nQ\n\nHere is a hint to help you:\nuse 2"


# ---------------------------------------------------------------------------------------------
# Malformed rows: errors name the file, the line and the field
# ---------------------------------------------------------------------------------------------


def _write(root, folder, stem, lines):
    (root / folder).mkdir(parents=True, exist_ok=True)
    path = root / folder / f"{stem}.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


GOOD_GSM = {"question": "What is 1 + 1?", "answer": "1 + 1 = <<1+1=2>>2\n#### 2"}


@pytest.mark.parametrize("row, field, problem", [
    ({"question": "Q?"}, "answer", "missing"),
    ({"question": "Q?", "answer": 7}, "answer", "must be a string, got int"),
    ({"question": "Q?", "answer": "It is 7."}, "answer", "no '#### <number>'"),
    ({"question": "Q?", "answer": "#### seven"}, "answer", "not a number"),
    ({"question": ["Q?"], "answer": "#### 7"}, "question", "must be a string, got list"),
    ({"question": "  ", "answer": "#### 7"}, "question", "empty"),
    ("{not json", "<row>", "not valid JSON"),
    ("[1, 2]", "<row>", "expected a JSON object"),
])
def test_malformed_gsm8k_rows(tmp_path, row, field, problem):
    path = _write(tmp_path, "gsm8k", "test", [GOOD_GSM, "", row])
    with pytest.raises(DatasetFormatError) as info:
        GSM8K(tmp_path).problems("test")
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), 3, field)
    assert str(path) in str(err) and "line 3" in str(err) and problem in str(err)


@pytest.mark.parametrize("row, field", [
    ({"target": 5}, "nums"),
    ({"target": "5", "nums": [1, 4]}, "target"),
    ({"target": 5, "nums": "1 4"}, "nums"),
    ({"target": 5, "nums": [1]}, "nums"),
    ({"target": 5, "nums": [1, 2.5]}, "nums"),
    ({"target": True, "nums": [1, 4]}, "target"),
])
def test_malformed_countdown_rows(tmp_path, row, field):
    _write(tmp_path, "countdown", "train", [{"target": 5, "nums": [1, 4]}, row])
    with pytest.raises(DatasetFormatError, match=f"line 2: field '{field}'"):
        Countdown(tmp_path).problems("train")


def test_malformed_math_rows(tmp_path):
    _write(tmp_path, "math500", "test", [{"problem": "P", "solution": "no box here", "level": 1}])
    with pytest.raises(DatasetFormatError, match=r"line 1: field 'answer': missing \(and no \\boxed"):
        MATH500(tmp_path).problems("test")
    _write(tmp_path, "math500", "test", [{"problem": "P", "answer": "1", "level": "hard"}])
    with pytest.raises(DatasetFormatError, match="field 'level'"):
        MATH500(tmp_path).problems("test")


def test_math_answer_from_boxed_solution_and_level_strings(tmp_path):
    rows = [
        {"problem": "P1", "solution": r"So it is $\boxed{\frac{1}{2}}$.", "level": "Level 3", "type": "Algebra"},
        {"problem": "P2", "answer": "4", "level": "Level 1", "type": "Algebra"},
    ]
    _write(tmp_path, "math_train_l3to5", "train", rows)
    problems = MATHLevel3to5(tmp_path).problems("train")
    assert len(problems) == 1  # level 1 is dropped
    p = problems[0]
    assert p.answer == r"\frac{1}{2}" and p.meta["level"] == 3 and p.meta["subject"] == "Algebra"
    assert p.uid == "math_l3to5/train/0"


def test_parquet_fallback(tmp_path, shared_data, tasks):
    # the real verl-format parquet (columns question / gt_answer), with no .jsonl next to it
    (tmp_path / "math_train_l3to5").mkdir()
    (tmp_path / "math_train_l3to5" / "train.parquet").symlink_to(shared_data / "math_train_l3to5" / "train.parquet")
    from_parquet = MATHLevel3to5(tmp_path).problems("train")
    from_jsonl = tasks["math_l3to5"].problems("train")
    assert [(p.uid, p.question, p.answer, p.meta["level"]) for p in from_parquet] == [
        (p.uid, p.question, p.answer, p.meta["level"]) for p in from_jsonl]
    assert from_parquet[0].meta["source"] == "math_train_l3to5/train.parquet"


# ---------------------------------------------------------------------------------------------
# Where the data comes from
# ---------------------------------------------------------------------------------------------


def test_env_var_is_the_default(monkeypatch, shared_data):
    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    assert len(GSM8K().problems("test")) == 1319


def test_missing_files_and_bad_arguments(tmp_path, monkeypatch):
    with pytest.raises(DatasetUnavailableError, match=r"gsm8k/test\.jsonl"):
        GSM8K(tmp_path).problems("test")
    with pytest.raises(ValueError, match="data_dir"):
        GSM8K(tmp_path / "nope")
    with pytest.raises(ValueError, match="source"):
        GSM8K(tmp_path, source="web")
    with pytest.raises(ValueError, match=r"split='train' is not available for task 'math500'; it has \['test'\]"):
        MATH500(tmp_path).problems("train")
    monkeypatch.delenv("RLCURATE_DATA_DIR", raising=False)
    with pytest.raises(DatasetUnavailableError, match="RLCURATE_DATA_DIR"):
        GSM8K(source="local").problems("test")
    monkeypatch.setenv("RLCURATE_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="RLCURATE_DATA_DIR"):
        GSM8K().problems("test")


def test_hub_offline_error_names_the_id(monkeypatch):
    monkeypatch.delenv("RLCURATE_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetUnavailableError) as info:
        GSM8K().problems("test")
    message = str(info.value)
    assert "'openai/gsm8k'" in message and "RLCURATE_DATA_DIR" in message and "gsm8k/test.jsonl" in message


def test_hub_rows_flow_through(monkeypatch):
    """The Hub path, with ``datasets.load_dataset`` replaced by a fake that records its call."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config=None, **kwargs):
        calls.append((name, config, kwargs))
        return [{"target": 10, "nums": [2, 5]}, {"target": 3, "nums": [1, 2]}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv("RLCURATE_DATA_DIR", raising=False)
    problems = Countdown().problems("test")
    assert calls == [("Jiayi-Pan/Countdown-Tasks-3to4", None, {"split": "train[8001:10002]"})]
    assert [p.uid for p in problems] == ["countdown/test/0", "countdown/test/1"]
    assert problems[0].meta["source"] == "hf://Jiayi-Pan/Countdown-Tasks-3to4[train[8001:10002]]"
    records = ds.read_hub(HubSpec("hkust-nlp/SimpleRL-Zoo-Data", "train", data_dir="simplelr_qwen_level3to5"))
    assert calls[-1] == ("hkust-nlp/SimpleRL-Zoo-Data", None, {"split": "train", "data_dir": "simplelr_qwen_level3to5"})
    assert records[1].line == 2 and records[1].index == 1


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_registry(shared_data):
    assert {"gsm8k", "math", "math500", "math_l3to5", "countdown"} <= set(available_tasks())
    assert isinstance(get_task("GSM8K", data_dir=shared_data), GSM8K)
    assert isinstance(get_task("math", data_dir=shared_data), MATH)
    assert get_task("countdown", format_score=0.1).format_score == 0.1
    with pytest.raises(ValueError, match=r"name='gsm9k' is not a known task; known tasks: .*countdown.*gsm8k"):
        get_task("gsm9k")
    with pytest.raises(ValueError, match="already registered"):
        register_task("gsm8k", MATH)
    register_task("gsm8k", GSM8K)  # the same factory again is fine
    with pytest.raises(ValueError, match="factory"):
        register_task("other", 3)


def test_gold_answers_parse(tasks):
    """Every gold answer is usable by its verifier (a bad gold would raise ValueError)."""
    for p in tasks["gsm8k"].problems("train")[:500]:
        gsm8k_reward("", p.answer)
    for p in tasks["math500"].problems("test")[:50]:
        math_reward("", p.answer)
    assert parse_gsm8k_solution("a\n<<1+1=2>>b\n#### 1,000") == (("a", "b"), "1000")
