"""``rlcurate dryrun``: a GPU configuration trained for a step or two through the code a GPU run uses,
on any machine, without the Hub (appendix A1, *What has run on a GPU*).

For ``configs/gpu_*.yaml`` the model named in the config is rebuilt with random weights from its
published architecture (:mod:`rlcurate.models.architectures`), written with ``save_pretrained`` next to
the real Qwen tokenizer, and the run loads it with ``from_pretrained`` exactly as it would load the Hub
checkpoint; the task reads the real dataset from ``RLCURATE_DATA_DIR``. Everything else is the config's:
strategy, loss, optimizer, micro-batching, bf16 autocast on CUDA. By default the lengths are cut so that
a CPU finishes (``--full`` keeps them, for a GPU). A random-weight model solves nothing, and a step
whose groups all get reward 0 trains nothing, so the task's verifier runs on every completion and its
reward is then replaced by a fixed pseudo-random 0 or 1 of the completion's text (:func:`coin_reward`):
the groups are mixed and the training step does its full work.

    rlcurate dryrun --config configs/gpu_grpo_qwen25_05b_gsm8k.yaml              # CPU: cut lengths
    rlcurate dryrun --config configs/gpu_grpo_qwen25_05b_gsm8k.yaml --full       # GPU: as configured

``--layers N`` keeps only the first N transformer layers (every width and the vocabulary stay real):
the CPU test does this so that a 1.5B model's optimizer state fits in its memory.

**The chapters' GPU cells in a dry run.** With ``RLCURATE_DRYRUN=1`` in the environment (and the chapter in
the ``smoke`` profile, so that everything else runs at test size) a chapter runs its GPU cells on any
machine: :func:`rlcurate.models.load_policy` and the trainer load, for a Hub id of
:mod:`rlcurate.models.architectures`, a random-weight checkpoint of that architecture with
:data:`DRY_RUN_LAYERS` layers (:func:`dry_run_checkpoint`, built once into the temporary folder); every
:class:`~rlcurate.train.Trainer` trains the config cut by :func:`dry_run_config` with coin rewards. ::

    RLCURATE_DRYRUN=1 RLCURATE_PROFILE=smoke python -m rlcurate.book.execute book/07_hinting.ipynb
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlcurate._help import ArgumentParser, HelpFormatter, wrap
from rlcurate.errors import UserError
from rlcurate.models.dry_run import DRY_RUN_ENV, DRY_RUN_LAYERS, dry_run_active, dry_run_checkpoint, tokenizer_dir
from rlcurate.train.dry_run import CUT, coin_reward, cut_changes, dry_run_config

__all__ = ["dry_run", "main", "CUT", "DRY_RUN_ENV", "DRY_RUN_LAYERS", "dry_run_active", "dry_run_checkpoint",
           "dry_run_config", "coin_reward", "tokenizer_dir"]


def dry_run(config_path, *, steps: int = 1, full: bool = False, layers: int | None = None,
            workdir=None, overrides: list[str] | None = None, device: str = "auto") -> dict[str, Any]:
    """Train the config's architecture with random weights for ``steps`` steps and one evaluation
    (module docstring). Returns the run's summary with times, the peak memory and what was changed. The
    random checkpoint is built in ``workdir`` (kept) or in a temporary folder removed afterwards."""
    from rlcurate.models.architectures import architecture
    from rlcurate.train.config import TrainConfig

    config = TrainConfig.load(config_path, overrides)
    try:
        depth = architecture(config.model)["num_hidden_layers"]
    except KeyError as exc:
        raise UserError(f"{config_path}: model {config.model!r}: {exc.args[0]}") from None
    if steps < 1:
        raise UserError(f"--steps must be at least 1, got {steps}")
    if layers is not None and layers > depth:
        raise UserError(f"--layers {layers}: {config.model} has {depth} layers; keep at most {depth}")
    tok_dir = tokenizer_dir()
    changes = cut_changes(config, steps)
    if full:
        changes = {k: v for k, v in changes.items() if k not in CUT}
    overridden = {item.split("=", 1)[0].split(".", 1)[0] for item in overrides or []}
    changes = {k: v for k, v in changes.items() if k not in overridden}  # a --set applies after the cut
    changes["device"] = device
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rlcurate_dryrun_"))
    try:
        return _dry_run(config, config_path, changes, work, tok_dir, layers=layers, full=full)
    finally:
        if workdir is None:  # the random checkpoint takes GBs for a 1.5B model: never left behind
            shutil.rmtree(work, ignore_errors=True)


def _dry_run(config, config_path, changes: dict[str, Any], work: Path, tok_dir: Path, *, layers: int | None,
             full: bool) -> dict[str, Any]:
    from rlcurate.models.architectures import architecture, random_checkpoint
    from rlcurate.presets import task_kwargs_for
    from rlcurate.train.config import TrainConfig
    from rlcurate.train.preflight import preflight

    def with_changes(**more):
        data = {**config.to_dict(), **changes, **more}
        return TrainConfig.from_dict(data, source=f"{config_path} (dry run)")

    changes["out_dir"] = str(work / "run")
    # every check a run makes without its model (the cut config, task, data, strategy), before the
    # checkpoint is built: a mistake costs seconds, not the build of a random model
    planned = with_changes()
    planned.task_kwargs, _ = task_kwargs_for(planned.model, planned.task, planned.task_kwargs)
    task, curator, _ = preflight(planned, check_model=False)

    model_id = config.model
    t0 = time.perf_counter()
    folder = random_checkpoint(model_id, work / "checkpoint", tok_dir, seed=config.seed,
                               **({"num_hidden_layers": layers} if layers else {}))
    t_build = time.perf_counter() - t0
    changes["model"] = str(folder)
    config = with_changes(task_kwargs=planned.task_kwargs)

    import torch

    from rlcurate.train import Trainer

    coin_reward(task)
    cuda = torch.cuda.is_available() and changes["device"] in ("auto", "cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    trainer = Trainer(config, task=task, curator=curator, final_checkpoint=False)  # nothing resumes a dry run
    summary = trainer.run()
    t_run = time.perf_counter() - t1
    peak = (torch.cuda.max_memory_allocated() if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    totals = summary["totals"]
    return {"config": str(config_path), "model": model_id, "layers": layers or architecture(model_id)["num_hidden_layers"],
            "full": full, "changed": {k: v for k, v in changes.items() if k not in ("out_dir", "model", "progress")},
            "device": str(trainer.device), "steps": summary["steps"],
            "build_s": round(t_build, 1), "run_s": round(t_run, 1),
            "time_generate_s": round(totals["time/generate"], 2), "time_train_s": round(totals["time/train"], 2),
            "time_eval_s": round(totals["time/eval"], 2),
            "rollouts": totals["rollouts"], "generated_tokens": totals["generated_tokens"],
            "trained_tokens": totals["trained_tokens"],
            "peak_memory_bytes": int(peak), "peak_memory_kind": "cuda max_memory_allocated" if cuda else "process max RSS (so far in this process)",
            "final_eval": summary["final_eval"]}


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="rlcurate dryrun", formatter_class=HelpFormatter,
                       description=wrap("Train a GPU configuration's architecture with random weights for a step "
                                        "and one evaluation, through the code a GPU run uses, without the Hub "
                                        "(appendix A1). Lengths are cut unless --full. Needs the Qwen tokenizer: "
                                        "RLCURATE_TOKENIZER_DIR, or RLCURATE_DATA_DIR holding qwen2.5-tokenizer/."))
    p.add_argument("--config", required=True, nargs="+", help="one or more configs/gpu_*.yaml")
    p.add_argument("--steps", type=int, default=1, help="training steps")
    p.add_argument("--full", action="store_true", help="keep the config's lengths and batch (for a GPU)")
    p.add_argument("--layers", type=int, help="keep only the first N transformer layers")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (applied after the cut: it wins over the cut's value)")
    p.add_argument("--json", help="write the results to this JSON file")
    args = p.parse_args(argv)
    for path in args.config:  # every file is checked before the first (expensive) run
        if not Path(path).is_file():
            raise UserError(f"config not found: {path}")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    if args.layers is not None and args.layers < 1:
        raise UserError(f"--layers must be a positive number of layers, got {args.layers}")
    if args.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {args.device!r}")
    if args.json and Path(args.json).expanduser().is_dir():
        raise UserError(f"--json {args.json}: a folder; give a file name for the results")
    if args.json and not Path(args.json).expanduser().absolute().parent.is_dir():
        raise UserError(f"--json {args.json}: its folder {Path(args.json).expanduser().absolute().parent} does not exist")
    tokenizer_dir()
    results = []
    for path in args.config:
        r = dry_run(path, steps=args.steps, full=args.full, layers=args.layers, overrides=args.overrides,
                    device=args.device)
        results.append(r)
        acc = (r["final_eval"] or {}).get("eval/accuracy")
        print(f"{path}: {r['steps']} step(s) on {r['device']} in {r['run_s']} s (generate {r['time_generate_s']} s, "
              f"train {r['time_train_s']} s, eval {r['time_eval_s']} s), peak {r['peak_memory_bytes'] / 2**30:.2f} GiB "
              f"({r['peak_memory_kind']}), eval accuracy {acc} (coin rewards)", flush=True)
        if args.json:  # written after every config, so a later failure loses nothing
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
