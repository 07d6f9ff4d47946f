"""The command line reads as a tool (issue #12): plain-text help with defaults, whole strategy
descriptions, ``python -m rlcurate``, and the SmolLM2 preset of the arithmetic task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcurate._help import plain
from rlcurate.cli import main
from rlcurate.presets import task_kwargs_for

REPO = Path(__file__).resolve().parents[1]

RST = ("``", ":class:", ":func:", ":mod:", ":meth:", "python -m rlcurate.")

# A default each command's --help must show.
DEFAULTS = {
    "train": "group_size = 8",
    "audit": "most tokens per completion (default: 64)",
    "warmstart": "optimizer steps (default: 2500)",
    "serve": "(default: 8000)",
    "runs": "(default: 1)",
    "conditions": "(default: data/runs/<suite name>)",
}


def help_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(DEFAULTS) + ["strategies"])
def test_every_help_is_plain_text_with_defaults(command, capsys):
    out = help_of([command, "--help"], capsys)
    assert out.startswith(f"usage: rlcurate {command} ")
    for markup in RST:
        assert markup not in out, f"{markup!r} in rlcurate {command} --help"
    if command in DEFAULTS:
        assert DEFAULTS[command] in " ".join(out.split())
    assert "(default: None)" not in out


def test_top_level_help_lists_the_commands(capsys):
    for argv in ([], ["--help"], ["help"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: rlcurate <command>")
        for command in ("train", "audit", "warmstart", "serve", "runs", "strategies", "RLCURATE_DATA_DIR"):
            assert command in out
        for markup in RST:
            assert markup not in out
    assert help_of(["help", "serve"], capsys).startswith("usage: rlcurate serve ")


def test_plain_strips_restructured_text():
    text = ("The ``rlcurate`` command, :class:`TransformersEngine`, :class:`~rlcurate.rollout.OpenAIEngine`, "
            ":mod:`rlcurate.rollout.server` (chapter 4, *The variance audit*), a * b, **strong**; example::")
    assert plain(text) == ("The rlcurate command, TransformersEngine, OpenAIEngine, rlcurate.rollout.server "
                           "(chapter 4, The variance audit), a * b, strong; example:")


def test_strategies_gives_whole_descriptions_and_explains_composition(capsys):
    import inspect

    from rlcurate.curation import available
    from rlcurate.curation.registry import config_class

    assert main(["strategies"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in available():
        first_paragraph = inspect.cleandoc(config_class(name).__doc__ or "").split("\n\n")[0]
        assert f"{name} {' '.join(plain(first_paragraph).split())}" in out
    assert "a+b combines two strategies: the selector of a" in out
    with pytest.raises(SystemExit):  # the help says how to add one's own (it named no RLCURATE_STRATEGIES)
        main(["strategies", "--help"])
    assert "name it in RLCURATE_STRATEGIES" in " ".join(capsys.readouterr().out.split())
    assert "the sampler and processors of b" in out
    assert "``" not in out


def test_strategies_describes_one_strategy_and_a_composition(capsys):
    assert main(["strategies", "insight+ada_seq_balanced"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("insight+ada_seq_balanced: the selector of insight with the sampler and processors "
                          "of ada_seq_balanced.")
    assert "options (strategy_kwargs) and their defaults:" in out
    assert "    mu = 0.3" in out and "    max_rounds = 4" in out


def test_strategies_lists_every_option_with_its_default_and_docstring(capsys):
    """``rlcurate strategies NAME`` and ``rlcurate strategies --help NAME``: the configuration
    dataclass's fields, each with its default and its docstring (issue #14)."""
    from rlcurate.config_cli import field_docs
    from rlcurate.curation.registry import config_class, options

    assert main(["strategies", "--help", "ada_est"]) == 0
    out = capsys.readouterr().out
    assert main(["strategies", "ada_est"]) == 0
    assert capsys.readouterr().out == out
    assert out.startswith("ada_est\n\n  Reinforce-Ada-Est")
    docs = field_docs(config_class("ada_est"))
    flat = " ".join(out.split())
    for key, default in options("ada_est").items():
        assert f"\n    {key} = {default!r}\n" in out
        assert " ".join(plain(docs[key]).split()) in flat
    assert "beta = 16.0 beta of the same estimate" in flat
    for markup in RST:
        assert markup not in out
    assert main(["strategies", "uniform"]) == 0
    assert "options: none" in capsys.readouterr().out


def test_python_dash_m_rlcurate():
    res = subprocess.run([sys.executable, "-m", "rlcurate", "strategies"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "uniform" in res.stdout and "insight" in res.stdout
    res = subprocess.run([sys.executable, "-m", "rlcurate", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("rlcurate ")


# ---------------------------------------------------------------- the SmolLM2 preset


def test_smollm2_picks_the_chat_style_of_arithmetic():
    kwargs, note = task_kwargs_for("smollm2", "arithmetic", {"n_test": 4})
    assert kwargs == {"n_test": 4, "style": "chat"} and "chat style" in note
    assert task_kwargs_for("smollm2", "arithmetic", {"style": "tiny"}) == ({"style": "tiny"}, None)
    assert task_kwargs_for("data/tiny/spread", "arithmetic", {}) == ({}, None)
    assert task_kwargs_for("smollm2", "gsm8k", {}) == ({}, None)


def test_preset_renders_chat_prompts_for_smollm2_and_tiny_ones_for_the_tiny_model(tmp_path):
    from transformers import AutoTokenizer

    from rlcurate.models.tiny import build_tiny_tokenizer
    from rlcurate.tasks import get_task

    # A ChatML template like SmolLM2's, on a tokenizer that needs no download.
    chatml = build_tiny_tokenizer()
    chatml.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = get_task("arithmetic", **task_kwargs_for("smollm2", "arithmetic", {})[0])
    problem = chat.problems("test")[0]
    m = problem.meta
    sym = {"add": "+", "sub": "-", "mul": "*"}[m["op"]]
    text = chat.render(problem, chatml)
    assert f"<|im_start|>user\nWhat is {m['a']} {sym} {m['b']}?<|im_end|>" in text
    assert text.endswith(f"<|im_start|>assistant\n{m['a']} {sym} {m['b']} =")
    assert "What is 3 + 4?" in text  # the few-shot turns

    tiny = get_task("arithmetic", **task_kwargs_for("data/tiny/spread", "arithmetic", {})[0])
    problem = tiny.problems("test")[0]
    m = problem.meta
    sym = {"add": "+", "sub": "-", "mul": "*"}[m["op"]]
    assert tiny.render(problem, AutoTokenizer.from_pretrained("data/tiny/spread")) == (
        f"<|user|>{m['a']}{sym}{m['b']}=<|assistant|>")


def test_audit_cli_applies_the_preset_before_loading(tmp_path, capsys, monkeypatch):
    """``--model smollm2`` reaches the audit with style chat, and says so on stderr."""
    import rlcurate.audit.runner as runner

    seen = {}

    def stop_at_run(config, out, **kwargs):
        seen["task_kwargs"] = config.task_kwargs
        raise runner.AuditError("stopped by the test before loading the model")

    monkeypatch.setattr(runner, "run_audit", stop_at_run)
    assert main(["audit", "--model", "smollm2", "--task", "arithmetic", "--out", str(tmp_path / "a")]) == 2
    assert seen["task_kwargs"] == {"style": "chat"}
    assert "model smollm2: the arithmetic task uses its chat style" in capsys.readouterr().err


def test_train_cli_applies_the_preset(tmp_path, capsys, monkeypatch):
    import rlcurate.train as train

    seen = {}

    class FakeTrainer:
        def __init__(self, config, **kwargs):
            seen["task_kwargs"] = dict(config.task_kwargs)

        def run(self):
            return {"first_eval": None, "final_eval": None}

    monkeypatch.setattr(train, "Trainer", FakeTrainer)
    out = str(tmp_path / "run")
    assert main(["train", "--set", "model=smollm2", "--set", f"out_dir={out}"]) == 0
    assert seen["task_kwargs"] == {"style": "chat"}
    assert "rlcurate train: model smollm2: the arithmetic task uses its chat style" in capsys.readouterr().err
    assert main(["train", "--set", "model=smollm2", "--set", "task_kwargs={style: tiny}",
                 "--set", f"out_dir={out}"]) == 0
    assert seen["task_kwargs"] == {"style": "tiny"} and "chat style" not in capsys.readouterr().err


def test_help_lists_every_task_and_strategy_and_explains_each_option(capsys):
    """Issue #30: train --help left out the math task and dro_filter (a docstring's list went stale), compare's
    --currency had no help, and plan without arguments printed its prefix twice."""
    from rlcurate.cli import main
    from rlcurate.curation.registry import available
    from rlcurate.tasks import available_tasks

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in available_tasks()) and all(name in text for name in available())
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "the compute axis" in capsys.readouterr().out
    assert main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err.count("rlcurate plan") == 1 and "give --config or --suite" in err


def test_train_ends_with_a_short_table_and_no_loading_bars(tmp_path, capfd):
    """Issue #30: train used to end with 45 lines of JSON at 16 digits (the last step's training metrics in
    final_eval) and every command printed transformers' loading bars."""
    from rlcurate.cli import main

    out = tmp_path / "run"
    assert main(["train", "--config", str(REPO / "configs" / "tiny_uniform.yaml"), "--set", "steps=2", "--set",
                 "eval_every=2", "--set", "eval_prompts=8", "--set", "eval_samples=2", "--set", f"out_dir={out}",
                 "--set", "save_model=false", "--set", "progress=false"]) == 0
    captured = capfd.readouterr()
    lines = captured.out.strip().splitlines()
    assert lines[0].split() == ["out_dir", str(out)] and lines[-1].split() == ["summary", str(out / "summary.json")]
    assert len(lines) <= 12 and "accuracy" in captured.out and "grad_norm" not in captured.out
    assert "Loading weights" not in captured.err
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    # rho needs three steps after the first (which pays for warm-up): two steps say so
    assert [ln.split(None, 1)[1] for ln in lines if ln.startswith("rho")] == [
        "n/a (needs 3 steps after the first that train a rollout; chapter 10)"]


def test_rho_is_the_median_over_the_steps_after_the_first():
    from rlcurate.cli import train_to_generate_ratio

    def step(k, train, trained, gen, rollouts=128):
        return {"step": k, "time/train": train, "samples_nonzero_adv": trained, "time/generate": gen,
                "rollouts": rollouts}

    warm_up = step(1, 9.0, 64, 30.0)  # the first step's times are left out
    steps = [warm_up, step(2, 2.0, 64, 2.0), step(3, 3.0, 64, 2.0), step(4, 4.0, 64, 2.0), step(5, 0.0, 0, 2.0)]
    assert train_to_generate_ratio(steps) == (3.0, 3)  # (3 / 64) / (2 / 128), median of 2, 3, 4
    assert train_to_generate_ratio(steps[:3]) is None  # two steps after the first
