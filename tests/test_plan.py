"""GPU readiness without a GPU (issue #17): the planner's memory model against measurements, its verdict
on every shipped GPU configuration and suite, the dry run of the GPU code path, the validation split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcurate.cli import main
from rlcurate.plan import PROMPT_TOKENS, activation_bytes_per_token, plan_config
from rlcurate.train.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
GPU_CONFIGS = sorted((REPO / "configs").glob("gpu_*.yaml"))
GPU_SUITES = sorted((REPO / "configs" / "suites").glob("gpu_*.yaml"))


def test_there_are_gpu_configs_and_suites():
    assert len(GPU_CONFIGS) >= 8 and len(GPU_SUITES) >= 3


@pytest.mark.parametrize("path", GPU_CONFIGS + GPU_SUITES, ids=lambda p: p.name)
def test_every_shipped_gpu_config_and_suite_fits_an_80gb_card(path, capsys):
    flag = "--suite" if path.parent.name == "suites" else "--config"
    assert main(["plan", flag, str(path), "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "DOES NOT FIT" not in out and "GPU-hours" in out


def test_set_applies_to_every_run_of_a_suite(capsys):
    """`plan --suite S --set k=v` plans the suite with the change (it was silently ignored for suites)."""
    import re

    path = REPO / "configs" / "suites" / "gpu_end_to_end_gsm8k.yaml"

    def hours(*extra):
        assert main(["plan", "--suite", str(path), *extra]) == 0
        return float(re.search(r"suite gpu_end_to_end_gsm8k .*: (\d+) GPU-hours", capsys.readouterr().out).group(1))

    assert hours("--set", "decode=dynamic") > 2 * hours()  # eager decode, about four times the captured loop's hours


def test_a_config_that_does_not_fit_is_refused_with_the_knob_to_turn(capsys):
    path = REPO / "configs" / "gpu_e2e_qwen25_math_15b.yaml"
    assert main(["plan", "--config", str(path), "--set", "micro_batch_tokens=32768"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "micro_batch_tokens <=" in out and "gradient_checkpointing" in out
    # the knob it names makes the config fit
    limit = int(out.split("micro_batch_tokens <= ")[1].split()[0])
    assert main(["plan", "--config", str(path), "--set", f"micro_batch_tokens={limit}"]) == 0
    assert main(["plan", "--config", str(path), "--set", "micro_batch_tokens=32768",
                 "--set", "gradient_checkpointing=true"]) == 0


def test_plan_bad_input_is_one_line(capsys):
    for argv, message in ((["--config", str(GPU_CONFIGS[0]), "--gpu", "h1000"], "--gpu 'h1000': unknown"),
                          ([], "give --config or --suite"),
                          (["--config", str(REPO / "configs" / "tiny_uniform.yaml")], "no architecture recorded")):
        assert main(["plan", *argv]) != 0
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_memory_terms_add_up_and_grow_with_the_micro_batch():
    config = TrainConfig.load(REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml")
    small = plan_config(config)
    config.micro_batch_tokens *= 2
    large = plan_config(config)
    assert large.memory["train_activations"] == pytest.approx(2 * small.memory["train_activations"], rel=0.05)
    static = sum(v for k, v in small.memory.items() if not k.startswith(("train_", "gen_")))
    train = sum(v for k, v in small.memory.items() if k.startswith("train_"))
    gen = sum(v for k, v in small.memory.items() if k.startswith("gen_"))
    assert small.peak_bytes == pytest.approx(static + max(train, gen))
    assert small.memory["adam"] == 2 * small.memory["weights"] == 8 * small.params
    config.kl_coef = 0.04  # a reference model: a copy of the fp32 weights
    assert plan_config(config).memory["reference"] == 4 * small.params
    config.rollout_weights = "bf16"  # a bf16 copy for rollouts: 2 bytes a parameter more
    assert plan_config(config).memory["rollout_copy"] == 2 * small.params
    config.decode = "dynamic"
    bf16_kv = plan_config(config).memory["gen_kv_cache"]
    config.dtype = "fp32"  # no autocast: the KV cache in fp32, twice the bytes (KV_DTYPE_BYTES)
    assert plan_config(config).memory["gen_kv_cache"] == pytest.approx(2 * bf16_kv)


def test_a_captured_decode_holds_its_cache_through_training_and_decodes_faster():
    """decode captured: the persistent cache (the largest batch's bucket of rows x the longest prompt plus
    max_new_tokens, in 64s) and the step state are static terms, added to training's peak; the decode step is
    charged the H200 trainer's captured rate, the bf16 rollout copy's lower one, instead of the eager loop's."""
    from rlcurate.models.architectures import hf_config
    from rlcurate.plan import KV_DTYPE_BYTES, kv_bytes_per_token

    config = TrainConfig.load(REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml")
    assert config.decode == "captured"
    captured = plan_config(config)
    config.decode = "dynamic"
    eager = plan_config(config)
    p_min, _, p_max = PROMPT_TOKENS["gsm8k"]
    arch = hf_config(config.model)
    cols = -(-(p_max + config.max_new_tokens) // 64) * 64  # 243 + 512 -> 768
    assert captured.memory["decode_cache"] == kv_bytes_per_token(arch, KV_DTYPE_BYTES["auto"]) * 512 * cols
    assert "gen_kv_cache" not in captured.memory and "decode_cache" not in eager.memory
    static = sum(v for k, v in captured.memory.items() if not k.startswith(("train_", "gen_")))
    train = sum(v for k, v in captured.memory.items() if k.startswith("train_"))
    assert captured.peak_bytes == pytest.approx(static + train)
    assert eager.seconds["generate_per_step"] > 4 * captured.seconds["generate_per_step"]
    # every plan says on which card its decode rate was measured (neither rate is scaled by card)
    assert "captured step's rate, measured on an H200 (likely optimistic on an H100" in captured.describe()
    assert "eager loop's rate, measured on an H100" in eager.describe()
    config.decode, config.rollout_weights = "captured", "bf16"
    assert plan_config(config).seconds["generate_per_step"] < captured.seconds["generate_per_step"]
    # a cache too large to hold through training: the advice names decode dynamic
    config.gen_token_budget, config.max_new_tokens = 4 * 1048576, 4096
    refused = plan_config(config)
    assert not refused.fits and any(a.startswith("decode: dynamic") for a in refused.advice)


def test_predicted_activations_match_the_h100_measurements():
    """bench/bench_memory.py on the H100 (data/bench/memory_h100.json): the formula within 15 % (it was
    within 3 %) of the measured bytes per completion token, for each architecture."""
    from rlcurate.models.architectures import hf_config

    record = json.loads((REPO / "data" / "bench" / "memory_h100.json").read_text())
    assert "H100" in record["device"]
    for r in record["results"]:
        measured = r["per_completion_token"]["saved_bytes"]
        predicted = activation_bytes_per_token(hf_config(r["model"]))
        assert abs(predicted / measured - 1) < 0.15, r["model"]
        # what autograd saved is what the allocator held after the forward pass
        assert r["per_completion_token"]["allocated_after_forward"] == pytest.approx(measured, rel=0.05)


def test_the_decode_rates_per_row_are_the_benchmarks_slopes():
    """The planner's per-row decode rates come from the stored GPU benchmarks: the eager one is the least-squares
    slope of the H100 throughput bench's four engine points (ms a step against rows), the captured one the
    H200's captured step from 64 to 1,024 rows with bf16 weights."""
    from rlcurate.plan import DECODE_S_PER_ROW

    eager = json.loads((REPO / "data" / "bench" / "gpu_h100.json").read_text())["rollout"]
    rows = [r["batch"] for r in eager]
    step_s = [r["engine"]["median_s"] / r["new_tokens"] for r in eager]
    assert DECODE_S_PER_ROW["eager"] == pytest.approx(np.polyfit(rows, step_s, 1)[0], rel=0.01)
    cells = json.loads((REPO / "data" / "bench" / "decode_captured_h200.json").read_text())["cells"]
    ms = {c["rows"]: c["results"]["captured"]["ms_per_step"] for c in cells if c["weights"] == "bf16"}
    assert DECODE_S_PER_ROW["captured"] == pytest.approx((ms[1024] - ms[64]) / 960 / 1000, rel=0.01)


@pytest.mark.slow
def test_predicted_activations_match_a_cpu_measurement(one_thread):
    """The same measurement on the CPU (two layers of the real 0.5B architecture, forward only)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import bench_memory

    from rlcurate.models.architectures import hf_config
    from transformers import AutoModelForCausalLM

    config = hf_config("Qwen/Qwen2.5-0.5B-Instruct", num_hidden_layers=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    saved = [bench_memory.measure(model, bench_memory.make_samples(config.vocab_size, 8, 8, 32, L, seed=L),
                                  torch.device("cpu"), backward=False)["saved_bytes"] for L in (8, 24)]
    per_token = (saved[1] - saved[0]) / (8 * 16)
    assert abs(activation_bytes_per_token(config) / per_token - 1) < 0.15


def test_prompt_lengths_are_the_measured_ones(shared_data, monkeypatch):
    """PROMPT_TOKENS is what the trainer renders: the Qwen chat template over the training split."""
    from transformers import AutoTokenizer

    from rlcurate.models.hf import prepare_tokenizer
    from rlcurate.tasks.registry import get_task

    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(shared_data / "qwen2.5-tokenizer"))
    for name in ("gsm8k", "countdown"):
        task = get_task(name)
        lengths = np.array([len(tok.encode(task.render(p, tok), add_special_tokens=False))
                            for p in task.problems("train")[:3000]])
        lo, mean, hi = PROMPT_TOKENS[name]
        assert (lengths.min(), round(lengths.mean()), lengths.max()) == (lo, mean, hi), name


def test_validation_split_is_cut_from_the_end_of_the_training_file(shared_data):
    from rlcurate.tasks.registry import get_task

    full = get_task("gsm8k", data_dir=shared_data).problems("train")
    task = get_task("gsm8k", data_dir=shared_data, validation_size=256)
    train, val = task.problems("train"), task.problems("validation")
    assert [p.uid for p in train + val] == [p.uid for p in full] and len(val) == 256
    with pytest.raises(ValueError, match="validation_size"):
        get_task("gsm8k", data_dir=shared_data).problems("validation")
    with pytest.raises(ValueError, match="validation_size must be"):
        get_task("gsm8k", data_dir=shared_data, validation_size=-1)


@pytest.mark.slow
@pytest.mark.parametrize("path", [REPO / "configs" / "gpu_insight_qwen3_06b_countdown.yaml"], ids=lambda p: p.stem)
def test_dry_run_trains_the_real_architecture_through_the_gpu_code_path(path, shared_data, monkeypatch, tmp_path,
                                                                         one_thread):
    """One step and one evaluation of the config's architecture (one layer, real widths and vocabulary,
    random weights saved and loaded like a Hub checkpoint, the real tokenizer and dataset): the
    training step trains every completion (coin rewards make every group mixed). Qwen2.5-0.5B on GSM8K
    (``gpu_grpo_qwen25_05b_gsm8k.yaml``) runs through the trainer in chapter 5's GPU cell
    (:func:`test_a_chapters_gpu_cell_runs_in_a_dry_run`), so it is not repeated here."""
    from rlcurate.dryrun import dry_run

    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    r = dry_run(path, layers=1, workdir=tmp_path, overrides=["threads=1", "prompts_per_step=1"])  # one group of 8
    assert r["steps"] == 1 and r["layers"] == 1 and r["rollouts"] > 0
    assert r["trained_tokens"] == r["generated_tokens"] > 0
    assert (tmp_path / "checkpoint" / "config.json").is_file() and (tmp_path / "checkpoint" / "tokenizer.json").is_file()
    assert not (tmp_path / "run" / "checkpoint").exists()  # nothing resumes a dry run
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [m for m in metrics if m["step"] == 1][0]
    assert step["samples_nonzero_adv"] == step["samples_trained"] > 0 and np.isfinite(step["grad_norm"])
    assert "eval/accuracy" in step


def test_dry_run_checks_the_run_before_building_the_checkpoint_and_leaves_no_temporary_folder(
        tmp_path, capsys, shared_data, monkeypatch):
    """The task's data is checked before the random checkpoint is built (a 1.5B one takes minutes and GBs);
    the temporary folder is removed whatever happens; a --set wins over the cut."""
    import tempfile

    import rlcurate.models.architectures as architectures
    import rlcurate.train as train
    from rlcurate.dryrun import dry_run
    from rlcurate.train.dry_run import CUT

    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    built, trained = [], []
    monkeypatch.setattr(architectures, "random_checkpoint", lambda model, folder, *a, **k: built.append(folder) or folder)

    class Stop(Exception):
        pass

    def trainer(config, **kwargs):
        trained.append(config)
        raise Stop

    monkeypatch.setattr(train, "Trainer", trainer)
    config = REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml"
    assert main(["dryrun", "--config", str(config), "--set", "task_kwargs.data_dir=/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "is not a directory" in err and len(err.strip().splitlines()) == 1 and not built
    with pytest.raises(Stop):
        dry_run(config, overrides=["max_new_tokens=24"])
    assert len(built) == 1 and trained[0].max_new_tokens == 24 and trained[0].prompts_per_step == CUT["prompts_per_step"]
    assert trained[0].model == str(built[0]) and not list((tmp_path / "tmp").iterdir())


def test_dry_run_refuses_an_unknown_model_before_building_anything(tmp_path, capsys, shared_data, monkeypatch):
    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: someone/unknown-model\ntask: gsm8k\n")
    for argv, message in ((["--config", str(cfg)], "no architecture recorded for 'someone/unknown-model'"),
                          (["--config", str(tmp_path / "missing.yaml")], "config not found")):
        assert main(["dryrun", *argv]) != 0
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "checkpoint").exists()


@pytest.mark.parametrize("overrides", [["checkpoint_every=1", "save_model=false"], ["checkpoint_every=0", "save_model=true"]],
                         ids=["two-checkpoints", "one-and-final-model"])
def test_the_plans_disk_is_what_the_trainer_checks(tmp_path, monkeypatch, one_thread, overrides):
    """``rlcurate plan``'s disk line is the space the trainer refuses to start without: one byte less is refused,
    exactly that much is enough."""
    import collections
    import shutil

    from rlcurate.errors import UserError
    from rlcurate.plan import plan_config
    from rlcurate.train import Trainer

    config = TrainConfig.load(REPO / "configs" / "tiny_uniform.yaml", [
        "steps=2", "eval_every=0", "progress=false", "threads=1", f"out_dir={tmp_path / 'run'}", *overrides])
    arch = json.loads((REPO / config.model / "config.json").read_text())
    from transformers import AutoConfig

    plan = plan_config(config, prompt_tokens=(8, 12, 16), arch_config=AutoConfig.for_model(arch.pop("model_type"), **arch))
    need, checkpoint, _ = plan.disk
    assert checkpoint == 12 * plan.params
    assert need == (2 * checkpoint if "checkpoint_every=1" in overrides else checkpoint + 4 * plan.params)
    assert "disk: " in plan.describe() and ("final model" in plan.describe()) == ("save_model=true" in overrides)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * need, 0, need - 1))
    with pytest.raises(UserError, match="free there, but this run needs"):
        Trainer(config)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * need, 0, need))
    assert Trainer(config).step == 0


def test_micro_batches_sized_from_a_memory_budget(tmp_path, one_thread):
    """``micro_batch_memory_gib``: the trainer's micro-batches hold the most tokens whose activations
    (with the planner's margin) fit the budget; the saved config keeps micro_batch_tokens as given (a
    resume sees no change), and the planner sizes them the same way."""
    from rlcurate.policy.memory import ACTIVATION_MARGIN, micro_batch_tokens_for
    from rlcurate.train import Trainer

    budget = 0.01
    config = TrainConfig.load(REPO / "configs" / "tiny_uniform.yaml", [
        "steps=1", "prompts_per_step=2", "eval_every=0", "checkpoint_every=0", "progress=false", "threads=1",
        f"micro_batch_memory_gib={budget}", f"out_dir={tmp_path / 'run'}"])
    trainer = Trainer(config)
    per_token = activation_bytes_per_token(trainer.model.config)
    tokens = trainer.policy.token_budget
    assert tokens == micro_batch_tokens_for(trainer.model.config, budget * 2**30)
    assert tokens * per_token * ACTIVATION_MARGIN <= budget * 2**30 < (tokens + 1) * per_token * ACTIVATION_MARGIN
    trainer.run()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["micro_batch_tokens"] == TrainConfig().micro_batch_tokens and saved["micro_batch_memory_gib"] == budget

    gpu = TrainConfig.load(REPO / "configs" / "gpu_e2e_qwen25_math_15b.yaml",
                           ["micro_batch_tokens=32768", "micro_batch_memory_gib=30"])
    plan = plan_config(gpu)
    assert plan.fits and plan.assumptions["micro_batch_tokens"] < 32768
    assert plan.memory["train_activations"] <= 30 * 2**30
    with pytest.raises(ValueError, match="micro_batch_memory_gib must be >= 0"):
        TrainConfig(micro_batch_memory_gib=-1)


@pytest.mark.slow
def test_chapter_dry_run_switch_cuts_gpu_configs_and_loads_random_real_architectures(shared_data, monkeypatch, tmp_path):
    """``RLCURATE_DRYRUN=1`` (a chapter's GPU cells on any machine): GPU cells run, a GPU config is cut to two
    short steps on the CPU and never writes into its own out_dir, and a Hub id loads a two-layer random-weight
    checkpoint of its architecture (cached in the temporary folder); without the switch no model is replaced."""
    from rlcurate.book import gpu_cells
    from rlcurate.dryrun import DRY_RUN_LAYERS, dry_run_config
    from rlcurate.models import load_policy
    from rlcurate.train.config import TrainConfig

    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from rlcurate.models.dry_run import dry_run_model

    monkeypatch.delenv("RLCURATE_DRYRUN", raising=False)
    assert not gpu_cells("smoke") and not gpu_cells("cpu") and gpu_cells("gpu")
    assert dry_run_model("Qwen/Qwen2.5-Math-1.5B") is None
    monkeypatch.setenv("RLCURATE_DRYRUN", "1")
    assert gpu_cells("smoke")
    cfg = TrainConfig.load(REPO / "configs" / "gpu_ada_seq_qwen25_math_15b.yaml")
    cut = dry_run_config(cfg)
    assert cfg.steps == 100 and cfg.device == "cuda"  # the original is untouched
    assert cut.steps == 2 and cut.device == "auto" and cut.max_new_tokens == 8 and cut.prompts_per_step == 2
    assert Path(cut.out_dir).resolve().is_relative_to(tmp_path.resolve()) and cut.out_dir != cfg.out_dir
    assert cut.strategy == cfg.strategy and cut.strategy_kwargs == cfg.strategy_kwargs and cut.lr == cfg.lr
    folder = Path(cut.model)
    assert folder.parent == tmp_path and (folder / "config.json").is_file()
    model, tok = load_policy("Qwen/Qwen2.5-Math-1.5B")  # the same cached checkpoint
    assert model.config.num_hidden_layers == DRY_RUN_LAYERS and model.config.hidden_size == 1536
    assert model.config.vocab_size == 151936 and tok("12+3")["input_ids"]
    assert dry_run_config(TrainConfig(model=str(REPO / "data" / "tiny" / "spread"))).model.endswith("spread")


@pytest.mark.slow
@pytest.mark.notebook
def test_a_chapters_gpu_cell_runs_in_a_dry_run(shared_data, monkeypatch, tmp_path):
    """Chapter 5's set-up and GPU cells in the smoke profile with RLCURATE_DRYRUN=1: its GPU cell trains a two-layer
    random-weight Qwen2.5-0.5B-Instruct on GSM8K for two steps through the trainer (bench/bench_dryrun_chapters.py
    runs every chapter so, whole; appendix A1). The chapter's CPU cells run in test_notebooks.py."""
    import importlib.util

    monkeypatch.setenv("RLCURATE_DATA_DIR", str(shared_data))
    spec = importlib.util.spec_from_file_location("bench_dryrun_chapters", REPO / "bench" / "bench_dryrun_chapters.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "dry.json"
    chapter = REPO / "book" / "05_grpo_loop.ipynb"
    cut = bench.setup_and_gpu_cells(json.loads(chapter.read_text()))
    assert sum(bench.GPU_MARK in "".join(c["source"]) for c in cut["cells"]) == 1 and len(cut["cells"]) == 4
    assert bench.main([str(chapter), "--gpu-cells-only", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["chapters"][0]
    assert row["passed"] and any(line.startswith("step   2:") for line in row["gpu_cell_output"])
    assert any("predicted on one H100" in line for line in row["gpu_cell_output"])


def test_a_dry_run_checkpoint_is_rebuilt_when_its_architecture_changes(monkeypatch, tmp_path):
    """The cached random-weight checkpoint's folder is named by a hash of the architecture's fields, so an
    edit of :data:`rlcurate.models.architectures.ARCHITECTURES` never reuses a stale checkpoint."""
    from rlcurate.models import architectures, dry_run

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("RLCURATE_TOKENIZER_DIR", str(tok))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    built = []

    def fake_checkpoint(model_id, folder, tokenizer_dir, **changes):  # what random_checkpoint leaves behind
        built.append((model_id, changes))
        (Path(folder) / "config.json").write_text(json.dumps(architectures.architecture(model_id)))
        return folder

    monkeypatch.setattr(architectures, "random_checkpoint", fake_checkpoint)
    first = dry_run.dry_run_checkpoint("Qwen/Qwen2.5-0.5B-Instruct")
    assert dry_run.dry_run_checkpoint("Qwen/Qwen2.5-0.5B-Instruct") == first and len(built) == 1  # reused
    changed = dict(architectures.ARCHITECTURES["Qwen/Qwen2.5-0.5B-Instruct"], intermediate_size=1234)
    monkeypatch.setitem(architectures.ARCHITECTURES, "Qwen/Qwen2.5-0.5B-Instruct", changed)
    second = dry_run.dry_run_checkpoint("Qwen/Qwen2.5-0.5B-Instruct")
    assert second != first and len(built) == 2
    assert json.loads((second / "config.json").read_text())["intermediate_size"] == 1234


def test_a_full_disk_while_the_random_checkpoint_is_written_is_one_line(monkeypatch, tmp_path):
    """safetensors' error on a full disk (as CI met it) while a dry run writes its random-weight checkpoint: one
    line naming the folder, the model, the checkpoint's size and the free space; the cache keeps no half-written
    folder."""
    import transformers

    from rlcurate.errors import UserError
    from rlcurate.models import dry_run

    class SafetensorError(Exception):  # safetensors' own type, by name (it is defined in Rust)
        pass

    def full(self, folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"part of a model")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("RLCURATE_TOKENIZER_DIR", str(tok))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(dry_run, "DRY_RUN_LAYERS", 1)
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    with pytest.raises(UserError, match=r"could not write the random checkpoint of Qwen/Qwen2\.5-0\.5B-Instruct \(Error "
                                        r"while serializing: I/O error: No space left on device \(os error 28\)\): it "
                                        r"takes 0\.\d\d GiB and \d+\.\d\d GiB are free there; free some space or "
                                        r"set TMPDIR to a larger disk"):
        dry_run.dry_run_checkpoint("Qwen/Qwen2.5-0.5B-Instruct")
    assert not list(tmp_path.glob("rlcurate_dryrun_*"))


def test_the_chapters_gpu_runs_are_built_from_one_declaration(tmp_path):
    """rlcurate.book.gpu_runs: what the chapters' GPU cells train and appendix A1 plans, per profile."""
    from rlcurate.book import CHAPTER_GPU_RUNS, chapter_gpu_configs

    gpu = {ch: chapter_gpu_configs(ch, "gpu", tmp_path) for ch in CHAPTER_GPU_RUNS}
    assert {ch: {a: (c.strategy, c.steps) for a, c in arms.items()} for ch, arms in gpu.items() if ch != "10_end_to_end"} == {
        "05_grpo_loop": {"grpo": ("uniform", 10)},
        "06_adaptive_sampling": {"ada_seq_balanced": ("ada_seq_balanced", 8), "uniform_n4": ("uniform", 8)},
        "07_hinting": {"sage": ("sage", 6), "uniform": ("uniform", 6)},
        "08_dro": {"dro": ("dro", TrainConfig.load(REPO / "configs" / "gpu_dro_qwen25_05b_gsm8k.yaml").steps)},
        "09_insight": {"uniform": ("uniform", 6), "insight": ("insight", 6)}}
    assert gpu["06_adaptive_sampling"]["uniform_n4"].strategy_kwargs == {}
    assert gpu["07_hinting"]["sage"].eval_every == 6 and gpu["09_insight"]["insight"].eval_every == 6
    assert [c.max_rollouts for c in gpu["10_end_to_end"].values()] == [32 * 8 * 30] * 2
    assert all(c.out_dir == str(tmp_path / "gpu" / a) and not c.resume for arms in gpu.values() for a, c in arms.items())
    assert chapter_gpu_configs("07_hinting", "smoke")["sage"].steps == 2
    assert not any(tmp_path.iterdir())  # building them creates nothing


def test_a_dry_run_cuts_a_warm_up_that_would_outlast_its_steps():
    """Before: every dry run of a GPU config warned that its warm-up never finishes, a cut the dry run made."""
    from rlcurate.train import TrainConfig
    from rlcurate.train.dry_run import cut_changes

    config = TrainConfig.load(REPO / "configs" / "gpu_grpo_qwen25_05b_gsm8k.yaml")
    assert config.warmup_steps >= 2
    for steps in (1, 2):
        cut = TrainConfig.from_dict({**config.to_dict(), **cut_changes(config, steps)})
        assert cut.warmup_steps == 0 and cut.warmup_note() is None
    long = cut_changes(config, config.warmup_steps + 1)
    assert "warmup_steps" not in long  # a warm-up the steps outlast is kept
    # a config whose own warm-up never finishes keeps it, and the trainer's warning about it
    short = TrainConfig.from_dict({**config.to_dict(), "steps": config.warmup_steps})
    assert "warmup_steps" not in cut_changes(short, 1) and short.warmup_note()
