"""The supervised warm-start of the tiny model (chapter 4)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlcurate.models import warmstart as ws
from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlcurate.tasks.arithmetic import ArithmeticTask

SMOKE = ["--steps", "4", "--levels", "add1,add2", "--eval-every", "2", "--eval-per-level", "2", "--eval-samples", "2",
         "--log-every", "2", "--batch-size", "8", "--warmup-steps", "2", "--threads", "1", "--no-progress"]


def test_batches_mask_the_prompt_and_the_padding():
    tok = build_tiny_tokenizer()
    for placement in ("assistant", "user"):
        task = ArithmeticTask(["add2", "mul2x1"], hint_placement=placement)
        batches = ws.make_batches(tok, task, np.random.default_rng(0), batch_size=6, n_batches=3, hint_share=0.5)
        assert len(batches) == 3
        for b in batches:
            ids, labels, mask = b["input_ids"], b["labels"], b["attention_mask"]
            assert ids.shape == labels.shape == mask.shape and ids.shape[0] == 6
            for row_ids, row_labels, row_mask in zip(ids, labels, mask):
                n = int(row_mask.sum())
                assert (row_labels[n:] == -100).all() and (row_ids[n:] == tok.pad_token_id).all()
                supervised = tok.decode(row_labels[row_labels != -100].tolist())
                text = tok.decode(row_ids[:n].tolist())
                prompt = text[: len(text) - len(supervised)]
                assert text.endswith(supervised) and supervised.endswith("#" + text.split("#")[-1])
                assert supervised.endswith(tok.eos_token) and "#" not in prompt
                assert text.count("<|assistant|>") == 1
        again = ws.make_batches(tok, task, np.random.default_rng(0), batch_size=6, n_batches=3, hint_share=0.5)
        assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again))


def test_hinted_examples_appear_at_the_requested_share():
    tok = build_tiny_tokenizer()
    task = ArithmeticTask(["add3"])
    batches = ws.make_batches(tok, task, np.random.default_rng(1), batch_size=100, n_batches=2, hint_share=0.25)
    # an assistant-side hint moves the first supervised token past the revealed steps
    prompt_len = len(tok(task.render(task.problems("test")[0], tok))["input_ids"])
    first = [int((row != -100).nonzero()[0]) for b in batches for row in b["labels"]]
    share = np.mean([f > prompt_len for f in first])
    assert 0.15 < share < 0.35
    for hint_level in (0, 1, 3):
        p = task.problems("test")[0]
        ids, start = ws.encode_example(tok, task, p, hint_level)
        assert tok.decode(ids) == task.render(p, tok) + task.target(p) + tok.eos_token
        assert tok.decode(ids[:start]) == task.render(p, tok, hint=task.hint(p, hint_level) or None)


def test_learning_rate_schedule():
    cfg = ws.WarmStartConfig(steps=1000, warmup_steps=100, lr=1e-3)
    assert ws.learning_rate(0, cfg) == pytest.approx(1e-5)
    assert ws.learning_rate(99, cfg) == pytest.approx(1e-3)
    assert ws.learning_rate(900, cfg) == pytest.approx(1e-3)
    cos = ws.WarmStartConfig(steps=1000, warmup_steps=100, lr=1e-3, schedule="cosine", min_lr_ratio=0.1)
    assert ws.learning_rate(999, cos) == pytest.approx(1e-4, rel=1e-3)
    assert ws.learning_rate(550, cos) == pytest.approx(0.55e-3, rel=1e-2)


def test_summarize_counts_histogram_and_mixed_share():
    task = ArithmeticTask(["add1", "add2"], n_test=3)
    problems = task.problems("test")
    counts = np.array([0, 8, 4, 1, 8, 0][: len(problems)])
    s = ws.summarize_counts(problems, counts, 8)
    assert s["overall"]["hist"][0] == (counts == 0).sum() and sum(s["overall"]["hist"]) == len(problems)
    assert s["overall"]["mixed_share"] == pytest.approx(((counts > 0) & (counts < 8)).mean(), abs=1e-4)
    assert set(s["levels"]) == {"add1", "add2"}
    assert "| all |" in ws.format_summary(s)
    with pytest.raises(ValueError, match="counts"):
        ws.summarize_counts(problems, counts[:-1], 8)


def test_sampler_is_seeded_and_stops_at_eos():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(seed=0)
    prompts = ["<|user|>12+34=<|assistant|>", "<|user|>1+2=<|assistant|>"]
    a = ws.sample_completions(model, tok, prompts, n_samples=3, max_new_tokens=6, seed=5)
    b = ws.sample_completions(model, tok, prompts, n_samples=3, max_new_tokens=6, seed=5)
    assert a == b and [len(x) for x in a] == [3, 3]
    with pytest.raises(ValueError, match="n_samples"):
        ws.sample_completions(model, tok, prompts, n_samples=0)
    with pytest.raises(ValueError, match="temperature"):
        ws.sample_completions(model, tok, prompts, temperature=0)


def test_bad_configuration_raises_value_errors(capsys):
    with pytest.raises(ValueError, match="steps"):
        ws.WarmStartConfig(steps=0).validate()
    with pytest.raises(ValueError, match="hint_share"):
        ws.WarmStartConfig(hint_share=2.0).validate()
    with pytest.raises(ValueError, match="level"):
        ws.WarmStartConfig(levels=("add2", "pow2")).validate()
    with pytest.raises(ValueError, match="level_weights"):
        ws.WarmStartConfig(levels=("add2",), level_weights=(1.0, 2.0)).validate()
    assert ws.parse_save_at("spread=10,saturated=20", 20) == {10: "spread", 20: "saturated"}
    assert ws.parse_save_at("5,7", 10) == {5: "step5", 7: "step7"}
    assert ws.parse_save_at("a=3,b=max-mixed", 10) == {3: "a", "max-mixed": "b"}
    for bad in ["a=x", "0", "30", "a=5,b=5", "../x=3", "max-mixed", "a=max-mixed,b=max-mixed", "a=3,a=4"]:
        with pytest.raises(ValueError, match="save_at"):
            ws.parse_save_at(bad, 20)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        ws.main(["--out", "x", "--steps", "-3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--steps must be a positive integer, got -3" in err and "Traceback" not in err, err


def test_smoke_run_writes_every_file(tmp_path):
    out = tmp_path / "run"
    assert ws.main(["--out", str(out), "--seed", "3", "--save-at", "early=2,best=max-mixed,late=4", *SMOKE]) == 0
    assert (out / "best" / "model.safetensors").is_file()
    best = json.loads((out / "best" / "train_config.json").read_text())
    log = [json.loads(line) for line in (out / "late" / "train_log.jsonl").read_text().splitlines()]
    mixed = {r["step"]: r["eval"]["overall"]["mixed_share"] for r in log if "eval" in r}
    assert best["stage_step"] in mixed and mixed[best["stage_step"]] == max(mixed.values())
    from safetensors.torch import load_file

    same = load_file(out / {2: "early", 4: "late"}[best["stage_step"]] / "model.safetensors")
    kept = load_file(out / "best" / "model.safetensors")
    assert all(torch.equal(same[k], kept[k]) for k in same)
    for stage, step in (("early", 2), ("late", 4)):
        d = out / stage
        for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                     "chat_template.jinja", "train_config.json", "train_log.jsonl", "README.md", "rlcurate.json"):
            assert (d / name).is_file(), name
        cfg = json.loads((d / "train_config.json").read_text())
        assert cfg["seed"] == 3 and cfg["stage"] == stage and cfg["stage_step"] == step and cfg["lr"] == 1e-3
        log = [json.loads(line) for line in (d / "train_log.jsonl").read_text().splitlines()]
        assert max(r["step"] for r in log) == step
        assert any("loss" in r for r in log)
        evals = [r for r in log if "eval" in r]
        assert evals and sum(evals[-1]["eval"]["overall"]["hist"]) == evals[-1]["eval"]["overall"]["n_prompts"]
        assert any("hint_eval" in r for r in log)
        readme = (d / "README.md").read_text()
        assert "python -m rlcurate.models.warmstart --out" in readme
        assert "--save-at early=2,best=max-mixed,late=4" in readme
        assert "transformers" in readme and "Wall time" in readme
    overview = (out / "README.md").read_text()
    assert "| `early` | 2 |" in overview and "| `late` | 4 |" in overview
    # the README's command parses back to the same configuration
    command = (out / "late" / "README.md").read_text().split("```\n")[1].split("\n")[0]
    argv = command.split()[3:]
    assert ws.config_from_args(ws.build_parser().parse_args(argv)) == ws.config_from_args(
        ws.build_parser().parse_args(["--out", str(out), "--seed", "3", *SMOKE]))


def test_a_max_mixed_stage_alone_is_saved_with_eval_every_zero(tmp_path):
    """--eval-every 0 evaluates "only at saved stages and the end": the end is evaluated, so a max-mixed stage
    alone has a candidate and is saved (it saved nothing and exited 0)."""
    out = tmp_path / "run"
    argv = [a if a != "2" or SMOKE[i - 1] != "--eval-every" else "0" for i, a in enumerate(SMOKE)]
    assert ws.main(["--out", str(out), "--save-at", "best=max-mixed", *argv, "--no-hint-eval"]) == 0
    assert json.loads((out / "best" / "train_config.json").read_text())["stage_step"] == 4
    assert (out / "best" / "model.safetensors").is_file()


@pytest.mark.parametrize("stage", ["late", None], ids=["a-named-stage", "the-final-one"])
def test_a_full_disk_at_a_stage_is_one_line_naming_the_stages_kept(tmp_path, monkeypatch, capsys, stage):
    """safetensors' error on a full disk (as CI met it) while a stage is written: ``rlcurate warmstart`` says so
    in one line, with the stages already written, and exits 2 without a traceback; what was written of the stage
    no longer loads as a checkpoint (without stages the model goes to --out itself, which is kept)."""
    from rlcurate.cli import main
    from rlcurate.models.warmstart import training

    class SafetensorError(Exception):  # safetensors' own type, by name (it is defined in Rust)
        pass

    real = training.save_tiny

    def save_tiny(model, tokenizer, path, **info):
        if info["stage"] == stage:  # save_pretrained writes config.json before the weights
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.json").write_text("{}")
            (path / "model.safetensors").write_bytes(b"part of a model")
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(model, tokenizer, path, **info)

    monkeypatch.setattr(training, "save_tiny", save_tiny)
    out = tmp_path / "run"
    save_at = ["--save-at", "early=2,late=4"] if stage else []  # no stages: the model goes to --out itself
    assert main(["warmstart", "--out", str(out), *save_at, "--no-hint-eval", *SMOKE]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    err = [line for line in err.strip().splitlines() if not line.startswith("step ")]  # the evaluations' log
    path = out / stage if stage else out
    assert len(err) == 1 and re.fullmatch(
        re.escape(f"rlcurate warmstart: error: {path}: could not write stage {stage or 'final'!r} at step 4 (Error "
                  "while serializing: I/O error: No space left on device (os error 28); ") + r"\d+" + re.escape(
            " MiB free there): the stages written before are kept: " + ("'early' (step 2)" if stage else "none")
            + "; free some space and run the same command with --force (it trains again)"), err[0]), err
    assert not stage or (out / "early" / "model.safetensors").is_file()
    assert out.is_dir() and not (path / "config.json").exists() and not (path / "model.safetensors").exists()


def test_same_seed_gives_identical_weights(tmp_path):
    from safetensors.torch import load_file

    for name in ("a", "b"):
        ws.main(["--out", str(tmp_path / name), "--seed", "1", "--no-hint-eval", *SMOKE])
    wa, wb = (load_file(tmp_path / n / "model.safetensors") for n in ("a", "b"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    la, lb = ((tmp_path / n / "train_log.jsonl").read_text().splitlines() for n in ("a", "b"))
    strip = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in la]
    assert strip == [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lb]


def test_module_runs_as_a_script():
    result = subprocess.run([sys.executable, "-m", "rlcurate.models.warmstart", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and "--save-at" in result.stdout
