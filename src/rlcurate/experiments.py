"""Reference runs: suites of training runs made by a command, committed as JSON (chapters 5-10).

Long runs are not made inside the notebooks. A *suite* (a YAML file in ``configs/suites/``) names a
base config, overrides shared by every run, the seeds, and one entry per run (usually one strategy)::

    name: end_to_end
    base: configs/tiny_uniform.yaml
    overrides: {max_rollouts: 25600, steps: 1000, eval_every: 10}
    seeds: [0, 1, 2]
    runs:
      uniform: {}
      ada_seq_balanced: {strategy: ada_seq_balanced}

``rlcurate runs --suite configs/suites/end_to_end.yaml`` trains every (run, seed) that has no result
yet, seed by seed (every run of a seed before the next seed, so a suite stopped part-way holds whole
paired seeds), a few at a time (``--jobs``), each in its own process, and writes
``data/runs/<suite>/<run>_s<seed>.json``: the config, seed, git SHA, package versions, device, wall
time, the command that regenerates it, and the per-step metrics the chapters plot. A finished result
is never recomputed unless ``--force`` is given, so an interrupted suite resumes where it stopped.
A run's resume checkpoint in the scratch folder is deleted once its result is written (a SmolLM2
run's is 1.6 GB: thirty of them filled this machine's disk).

Before any run starts, every (run, seed) to make is checked as ``rlcurate train`` checks a config
(:func:`rlcurate.train.preflight.preflight`: keys and values, strategy, task, model, a scratch folder
that holds a run with a different config); a bad suite file, an unknown run name or one bad run
config refuses the whole command with one line naming the file and the run. So does a scratch disk that
cannot hold the checkpoints of ``--jobs`` runs at a time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from rlcurate.errors import Stopped, UserError
from rlcurate.models.architectures import model_parameters
from rlcurate.runs_progress import SuiteProgress
from rlcurate.stopping import PARENT_ENV, STOP_SIGNALS, StopRequest, catch_stop_signals
from rlcurate.train.config import TrainConfig, _beside, read_yaml

log = logging.getLogger(__name__)

# Per-step keys kept in a reference run (the rest of metrics.jsonl stays in the scratch run folder).
KEEP_PREFIXES = ("eval/", "total/", "time/", "curation/")
KEEP_KEYS = {"step", "reward_mean", "effective_prompt_ratio", "frac_all_right", "frac_all_wrong", "rollouts",
             "generated_tokens", "trained_tokens", "groups_trained", "groups_trained_mixed",
             "samples_nonzero_adv", "entropy", "grad_norm", "clip_frac", "kl_ref", "uncharged_rollouts"}


def load_suite(path: str | Path) -> dict[str, Any]:
    """Read and check a suite file; errors (:class:`~rlcurate.errors.UserError`) name the file and
    the problem."""
    path = Path(path)
    suite = read_yaml(path, what="suite file")
    if not isinstance(suite, dict):
        raise UserError(f"{path}: a suite must be a mapping with keys name, base, runs (and overrides, seeds), "
                        f"got a {type(suite).__name__}")
    for key in ("name", "base", "runs"):
        if key not in suite:
            raise UserError(f"{path}: missing key {key!r} (a suite needs name, base, runs)")
    unknown = sorted(set(suite) - {"name", "base", "runs", "overrides", "seeds", "endpoint"}, key=str)
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(map(str, unknown))}; a suite has name, base, runs, "
                        "overrides, seeds, endpoint")
    if "endpoint" in suite:
        suite["endpoint"] = check_endpoint(suite["endpoint"], f"{path}: endpoint")
    if not isinstance(suite["name"], str) or not suite["name"].strip() or "/" in suite["name"]:
        raise UserError(f"{path}: name must be a folder name (no '/'), got {suite['name']!r}")
    if not isinstance(suite["runs"], dict) or not suite["runs"]:
        raise UserError(f"{path}: runs must be a non-empty mapping of run name to config overrides")
    for run, over in suite["runs"].items():
        if over is not None and not isinstance(over, dict):
            raise UserError(f"{path}: run {run!r} must map to config overrides (a mapping), got {over!r}")
    suite["overrides"] = suite.get("overrides") or {}
    if not isinstance(suite["overrides"], dict):
        raise UserError(f"{path}: overrides must be a mapping of config keys, got {suite['overrides']!r}")
    for where, over in [("overrides", suite["overrides"])] + [(f"run {r!r}", o or {}) for r, o in suite["runs"].items()]:
        for key, instead in SUITE_SETS.items():
            if key in over:
                raise UserError(f"{path}: {where} sets {key}: {over[key]!r}, which `rlcurate runs` sets itself; "
                                f"{instead}")
    suite["seeds"] = suite.get("seeds", [0])
    seeds = suite["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds):
        raise UserError(f"{path}: seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    suite["_path"] = str(path)
    return suite


SUITE_SETS = {"seed": "a suite's seeds are its seeds: list (or --seeds)",
              "out_dir": "each run's folder is --scratch/<run>_s<seed> (choose the folder with --scratch)",
              "resume": "a run stopped part-way always resumes (--force starts it over)"}
"""Config keys :func:`run_config` sets for every (run, seed): a suite that sets one is refused, not overridden."""

RESULT_NEUTRAL_KEYS = frozenset({"out_dir", "resume", "progress", "threads", "save_model", "checkpoint_every",
                                 "report_to"})
"""Config keys that do not change a run's metrics: a stored result that differs from its suite only in these is
current (:func:`stale_changes`)."""

ENDPOINTS = ("rollouts_to_target", "final", "area")


def check_endpoint(endpoint: Any, where: str) -> dict[str, Any]:
    """A suite's endpoint, declared before its runs (chapter 11): ``primary`` (one of :data:`ENDPOINTS`),
    for ``rollouts_to_target`` the target as ``close_gap`` (each seed's target is its start accuracy plus
    that share of the gap to 1) or as an accuracy ``target``, and optional ``secondary`` endpoints."""
    if not isinstance(endpoint, dict):
        raise UserError(f"{where} must be a mapping (primary, close_gap or target, secondary), got {endpoint!r}")
    bad = sorted(set(endpoint) - {"primary", "close_gap", "target", "secondary"}, key=str)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(map(str, bad))}; it has primary, close_gap or target, "
                        "secondary")
    if endpoint.get("primary") not in ENDPOINTS:
        raise UserError(f"{where}: primary must be one of {', '.join(ENDPOINTS)}, got {endpoint.get('primary')!r}")
    for key in [k for k in ("close_gap", "target") if k in endpoint]:
        v = endpoint[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
            raise UserError(f"{where}: {key} must be a number in (0, 1), got {v!r}")
    if endpoint["primary"] == "rollouts_to_target" and ("close_gap" in endpoint) == ("target" in endpoint):
        raise UserError(f"{where}: rollouts_to_target needs exactly one of close_gap and target")
    secondary = endpoint.get("secondary", [])
    if not isinstance(secondary, list) or any(x not in ENDPOINTS for x in secondary):
        raise UserError(f"{where}: secondary must be a list of {', '.join(ENDPOINTS)}, got {secondary!r}")
    return endpoint


def _find(relative: str, suite_path: Path) -> Path:
    """``relative`` from the working directory, else from the first folder above the suite file that
    holds it (suites name their base config relative to the repository root)."""
    path = Path(relative)
    if path.is_absolute() or path.exists():
        return path
    for parent in suite_path.resolve().parents:
        if (parent / path).exists():
            return parent / path
    raise UserError(f"{suite_path}: base config {relative!r} not found")


def run_config(suite: dict[str, Any], name: str, seed: int, scratch: Path) -> TrainConfig:
    """The full training config of one (run, seed) of a suite."""
    base_path = _find(suite["base"], Path(suite["_path"]))
    base = read_yaml(base_path, what="base config") or {}
    if not isinstance(base, dict):
        raise UserError(f"{base_path}: the base config must be a mapping of keys to values")
    data = {**base, **suite["overrides"], **(suite["runs"][name] or {})}
    if "model" in data:
        data["model"] = _model_beside(data["model"], suite)
    data.update(seed=int(seed), out_dir=str(scratch / f"{name}_s{seed}"), resume=True, progress=False)
    return TrainConfig.from_dict(data, source=f"{suite['_path']}: run {name!r}")


def _model_beside(model, suite: dict[str, Any]):
    """A relative checkpoint path found as `rlcurate train` finds one beside its config: above the suite file, else
    above its base config; else unchanged."""
    return _beside(_beside(model, Path(suite["_path"])), _find(suite["base"], Path(suite["_path"])))


def stale_changes(suite: dict[str, Any], result: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (stored, now)}``: how the config a stored result was made with differs from the one its suite now
    gives that (run, seed), outside :data:`RESULT_NEUTRAL_KEYS`; empty when the result is current (or its run is
    no longer in the suite, or it records no config). A relative model path that names the same checkpoint is the same model."""
    from rlcurate.train.preflight import config_changes

    if result.get("run") not in suite["runs"] or not result.get("config"):  # a result that records no config: no check
        return {}
    config = run_config(suite, result["run"], result["seed"], Path("runs") / suite["name"])
    changes = {k: v for k, v in config_changes(result["config"], config).items() if k not in RESULT_NEUTRAL_KEYS}
    if "model" in changes:
        old, new = (str(m) for m in changes["model"])
        if Path(_model_beside(old, suite)).resolve() == Path(new).resolve():
            del changes["model"]
    return changes


def check_current(suite: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """Refuse stored results made with another config than the suite now gives them (:func:`stale_changes`), in
    one line naming the first and what changed: paired with current runs they would compare two protocols."""
    try:
        stale = [(r, c) for r in results if (c := stale_changes(suite, r))]
    except UserError as exc:  # the suite's configs cannot be built here (its base config is elsewhere, say)
        print(f"warning: the results are not checked against {suite['_path']}'s configs: {exc}", file=sys.stderr)
        return
    if stale:
        r, changes = stale[0]
        what = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changes.items()))
        raise UserError(f"{len(stale)} stored result(s) of suite {suite['name']!r} were made with another config than "
                        f"{suite['_path']} now gives (run {r['run']!r} seed {r['seed']}: {what}); rerun them with "
                        f"`rlcurate runs --suite {suite['_path']} --force` (--only and --seeds choose them), or restore "
                        f"the suite file they were made with")


def result_path(out: Path, name: str, seed: int) -> Path:
    return out / f"{name}_s{seed}.json"


def default_out(suite: dict[str, Any]) -> Path:
    """Where ``rlcurate runs`` writes a suite's results without ``--out``."""
    return Path("data") / "runs" / suite["name"]


def default_scratch(suite: dict[str, Any]) -> Path:
    """Where ``rlcurate runs`` keeps a suite's run folders without ``--scratch``."""
    return Path("runs") / suite["name"]


def regenerate_command(suite: dict[str, Any], name: str, seed: int, out: Path | None = None,
                       scratch: Path | None = None) -> str:
    """The command that makes one run again, with the ``--out`` and ``--scratch`` it was made with where
    they were not the defaults (so that the result lands where this one is)."""
    cmd = f"rlcurate runs --suite {shlex.quote(str(suite['_path']))} --only {name} --seeds {seed} --force"
    for flag, folder, default in (("--out", out, default_out(suite)), ("--scratch", scratch, default_scratch(suite))):
        if folder is not None and Path(folder) != default:
            cmd += f" {flag} {shlex.quote(str(folder))}"
    return cmd


def _compact(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k in KEEP_KEYS or k.startswith(KEEP_PREFIXES)}


class RunStopped(Exception):
    """A run's process stopped on a signal after saving a checkpoint (``rlcurate train``)."""


# the `rlcurate train` processes of a `runs` command, and the stop signal it got (passed on to each)
_CHILDREN: set = set()
_CHILDREN_LOCK = threading.Lock()
_STOP = StopRequest()


def _pass_on(signum: int) -> None:
    with _CHILDREN_LOCK:
        for child in _CHILDREN:
            child.send_signal(signum)


def run_one(suite: dict[str, Any], name: str, seed: int, out: Path, scratch: Path) -> dict[str, Any]:
    """Train one (run, seed) in a subprocess, write its reference-run JSON, then delete the run's resume
    checkpoint (its metrics and summary stay in the scratch folder)."""
    config = run_config(suite, name, seed, scratch)
    cfg_file = scratch / f"{name}_s{seed}.yaml"
    cfg_file.write_text(yaml.safe_dump(config.to_dict()))
    cmd = [sys.executable, "-m", "rlcurate.cli", "train", "--config", str(cfg_file)]
    start = time.perf_counter()
    # its own session: a Ctrl-C in the terminal reaches `runs` alone, which passes it on once (main)
    # and it ends with `runs`, even a `runs` killed with SIGKILL (rlcurate.stopping.end_with_parent)
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    with _CHILDREN_LOCK:
        _CHILDREN.add(proc)
    try:
        if _STOP.requested:  # the signal came while this child was starting
            proc.send_signal(_STOP.signum)
        stdout, stderr = proc.communicate()
    finally:
        with _CHILDREN_LOCK:
            _CHILDREN.discard(proc)
    wall = time.perf_counter() - start
    if proc.returncode in [128 + s for s in STOP_SIGNALS]:
        raise RunStopped(f"run {name} seed {seed} stopped at a checkpoint (exit {proc.returncode})")
    if proc.returncode != 0:
        raise RuntimeError(f"run {name} seed {seed} failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    run_dir = Path(config.out_dir)
    metrics = [_compact(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    env = json.loads((run_dir / "environment.json").read_text()) if (run_dir / "environment.json").exists() else {}
    result = {
        "suite": suite["name"], "run": name, "seed": int(seed), "config": config.to_dict(),
        "command": regenerate_command(suite, name, seed, out, scratch), "environment": env,
        "wall_seconds": wall, "summary": json.loads((run_dir / "summary.json").read_text()),
        "metrics": metrics,
    }
    path = result_path(out, name, seed)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=None, separators=(",", ":")) + "\n")
    tmp.replace(path)
    for folder in ("checkpoint", "checkpoint.old"):  # only an unfinished run resumes from them
        shutil.rmtree(run_dir / folder, ignore_errors=True)
    return result


def replay_prefix(result: dict[str, Any] | str | Path, steps: int, scratch: str | Path,
                  evaluate: bool = False) -> list[tuple[int, str, Any, Any]]:
    """Re-run the first ``steps`` steps of a committed reference run with the code as it is now and
    compare their metrics with the stored ones (issue #14: a refactor must not move the numbers).
    Returns ``(step, key, stored, now)`` for every value that differs (machine timings left out); an
    empty list means the prefix replays bit for bit. Without ``evaluate`` the held-out evaluations
    are skipped (they draw from their own stream and do not change training)."""
    from rlcurate.train import Trainer

    if not isinstance(result, dict):
        result = json.loads(Path(result).read_text())
    data = {**result["config"], "out_dir": str(Path(scratch) / f"{result['run']}_s{result['seed']}"),
            "steps": int(steps), "resume": False, "progress": False, "checkpoint_every": 0}
    if not evaluate:
        data["eval_every"] = 0
    config = TrainConfig.from_dict(data, source=f"replay of {result['suite']}/{result['run']} seed {result['seed']}")
    Trainer(config).run()
    now = [json.loads(line) for line in (Path(config.out_dir) / "metrics.jsonl").read_text().splitlines()]
    stored = {r["step"]: r for r in result["metrics"]}
    diffs = []
    for rec in now:
        old = stored.get(rec["step"], {})
        for key, value in _compact(rec).items():
            if key.startswith("time/") or (not evaluate and key.startswith("eval/")) or key not in old:
                continue
            if old[key] != value:
                diffs.append((rec["step"], key, old[key], value))
    return diffs


RESULT_KEYS = ("suite", "run", "seed", "config", "metrics")


def read_result(path: str | Path) -> dict[str, Any]:
    """One reference-run JSON, checked where it enters the analysis: readable (a truncated file is named),
    with its keys, every evaluation's accuracy a number in [0, 1] and every count of rollouts a finite
    number >= 0. A result that fails raises :class:`UserError` naming the file and the record."""
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable result ({type(exc).__name__}: {exc}); delete it and let "
                        "`rlcurate runs` recompute it") from None
    missing = [k for k in RESULT_KEYS if not isinstance(result, dict) or k not in result]
    if missing:
        raise UserError(f"{path}: not a reference-run result, it lacks {', '.join(missing)}")
    if not isinstance(result["metrics"], list):
        raise UserError(f"{path}: 'metrics' must be a list of records")
    for i, record in enumerate(result["metrics"]):
        for key, low, high in (("eval/accuracy", 0.0, 1.0), ("total/rollouts", 0.0, math.inf)):
            v = record.get(key) if isinstance(record, dict) else None
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and low <= v <= high):
                raise UserError(f"{path}: metrics record {i} has {key} = {v!r}; a result needs a finite number in "
                                f"[{low:g}, {high:g}] (recompute the run with `{result.get('command', 'rlcurate runs')}`)")
    return result


def result_is_readable(path: Path) -> bool:
    """Whether ``path`` holds a result :func:`read_result` accepts."""
    try:
        read_result(path)
        return True
    except UserError:
        return False


def load_results(out: str | Path, suite: str | None = None) -> list[dict[str, Any]]:
    """All reference runs in a folder (each checked by :func:`read_result`), sorted by run name and seed;
    with ``suite``, a run of another suite is refused, naming its file."""
    results = []
    for f in sorted(Path(out).glob("*_s*.json")):
        r = read_result(f)
        if suite is not None and r["suite"] != suite:
            raise UserError(f"{f}: a run of suite {r['suite']!r}, not of {suite!r}: read each suite's runs from "
                            f"its own folder (data/runs/{suite})")
        named = result_path(f.parent, r["run"], r["seed"])
        if f.name != named.name:  # a copy or a renamed file would pair as the run it holds, or replace it
            held = " (which is there too)" if named.exists() else ""
            raise UserError(f"{f}: holds run {r['run']!r} seed {r['seed']}, whose result is {named.name}{held}; "
                            f"move it out of the folder, or rename it if it is that run's only result")
        results.append(r)
    return sorted(results, key=lambda r: (r["run"], r["seed"]))


def pending_runs(names: list[str], seeds: list[int], out: Path, force: bool = False) -> list[tuple[str, int]]:
    """The (run, seed) pairs still to make, seed by seed with every run of a seed before the next seed:
    a suite stopped part-way then holds whole paired seeds, not some arms with all seeds and others
    with none."""
    todo = []
    for s in seeds:
        for n in names:
            path = result_path(out, n, s)
            readable = path.exists() and result_is_readable(path)
            if path.exists() and not readable and not force:
                log.warning("%s is not a readable result: it will be recomputed", path)
            if force or not readable:
                todo.append((n, s))
    return todo


def _check_runs(suite: dict[str, Any], todo: list[tuple[str, int]], out: Path, scratch: Path, force: bool,
                jobs: int = 1) -> list[tuple[str, int, TrainConfig]]:
    """Check every (run, seed) to make before any starts, as ``rlcurate train`` would (no model is
    loaded), then the scratch folder's free space for ``jobs`` runs at a time (:func:`_check_scratch_space`);
    with ``force`` the scratch folders are about to be emptied, so an old run there is no reason to refuse."""
    import dataclasses

    from rlcurate.train.preflight import RESULTS_REMEDY, RESUME_REMEDY, check_out_dir, preflight

    for flag, folder in (("--out", out), ("--scratch", scratch)):
        try:
            check_out_dir(str(folder))
        except UserError as exc:
            raise UserError(f"{flag}: {exc}") from None
    configs = []
    for n, s in todo:
        config = run_config(suite, n, s, scratch)
        configs.append((n, s, config))
        try:
            preflight(dataclasses.replace(config, resume=False) if force else config)
        except UserError as exc:  # a suite sets out_dir and resume itself: the remedies are --force or --scratch
            msg = str(exc).replace(RESUME_REMEDY, "use another --scratch, or --force to start this run over (its "
                                                  "checkpoint is then replaced)")
            msg = msg.replace(RESULTS_REMEDY, "use another --scratch, or --force to start this run over")
            raise UserError(f"{suite['_path']}: run {n!r} seed {s}: {msg}") from None
    _check_scratch_space(configs, scratch, force, jobs)
    return configs


def _start_over(configs: list[tuple[str, int, TrainConfig]]) -> None:
    """``--force``: empty each run's scratch folder so that it trains from its first step, except a run stopped
    part-way whose checkpoint holds the same config (a forced run interrupted earlier): it resumes, so that
    running the same command again after a stop loses nothing."""
    from rlcurate.train.preflight import check_resume, checkpoint_dir

    for _, _, config in configs:
        if checkpoint_dir(config.out_dir) is not None:
            try:
                check_resume(config)
                continue
            except UserError:
                pass
        shutil.rmtree(config.out_dir, ignore_errors=True)


def _check_scratch_space(runs: list[tuple[str, int, TrainConfig]], scratch: Path, force: bool, jobs: int) -> None:
    """Refuse a suite whose ``jobs`` runs at a time cannot all keep their checkpoints in ``scratch``: each
    checks its own room when it starts (the trainer's check, :meth:`TrainConfig.out_dir_need`), but runs
    started together each see the same free space. The need is the sum of the ``jobs`` largest runs' (a
    run's checkpoint holds its fp32 weights and AdamW's two moments, as the planner counts them; a model
    whose size only loading would tell is left to the trainer's check); with ``force`` the runs' old
    folders, about to be removed, count as free."""
    sizes: dict[str, int | None] = {}
    needs = []
    for n, s, config in runs:
        if config.model not in sizes:
            sizes[config.model] = model_parameters(config.model)
        if sizes[config.model] is None:
            continue
        folder = Path(config.out_dir)
        resumed = not force and any((folder / c).exists() for c in ("checkpoint", "checkpoint.old"))
        checkpoint = 12 * sizes[config.model]
        need, why = config.out_dir_need(checkpoint, 4 * sizes[config.model], resumed)
        needs.append((need, checkpoint, why, n, s))
    if not needs:
        return
    needs.sort(key=lambda item: -item[0])
    together = needs[:jobs]
    need = sum(item[0] for item in together)
    existing = next(p for p in (scratch, *scratch.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if force:
        free += sum(f.stat().st_size for _, _, config in runs for f in Path(config.out_dir).rglob("*") if f.is_file())
    if free >= need:
        return
    largest, checkpoint, why, n, s = together[0]
    who = f"{len(together)} runs at a time (--jobs {jobs}) need" if len(together) > 1 else f"run {n!r} seed {s} needs"
    raise UserError(f"--scratch {scratch}: {free / 2**30:.2f} GiB free there, but {who} {need / 2**30:.2f} GiB for "
                    f"checkpoints (run {n!r} seed {s}'s: {checkpoint / 2**30:.2f} GiB each, {why}); free some space, "
                    + ("lower --jobs " if len(together) > 1 else "") + "or choose another --scratch")


def _replay(names: list[str], seeds: list[int], out: Path, scratch: Path, steps: int) -> int:
    if steps < 1:
        raise UserError(f"--replay must be a positive number of steps, got {steps}")
    differing = 0
    for n in names:
        for s in seeds:
            path = result_path(out, n, s)
            if not path.exists():
                print(f"{n} seed {s}: no stored result in {out}")
                continue
            diffs = replay_prefix(path, steps, scratch / "replay")
            differing += bool(diffs)
            first = f"; first: step {diffs[0][0]} {diffs[0][1]} {diffs[0][2]!r} -> {diffs[0][3]!r}" if diffs else ""
            print(f"{n} seed {s}: {steps} steps, {len(diffs)} differing value(s){first}", flush=True)
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    from rlcurate._help import ArgumentParser, HelpFormatter, plain, wrap

    parser = ArgumentParser(prog="rlcurate runs", description=wrap(__doc__.splitlines()[0]),
                                     epilog=plain(__doc__.split("\n\n", 1)[1]), formatter_class=HelpFormatter)
    parser.add_argument("--suite", required=True, help="suite YAML (configs/suites/NAME.yaml)")
    parser.add_argument("--out", help="result folder (default data/runs/<suite name>)")
    parser.add_argument("--only", help="comma-separated run names (default: all)")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the suite's)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each uses the config's threads)")
    parser.add_argument("--scratch", help="folder for the runs' checkpoints and logs (default runs/<suite>)")
    parser.add_argument("--force", action="store_true",
                        help="recompute results that already exist (a run stopped part-way with the same config "
                             "resumes; any other starts over)")
    parser.add_argument("--list", action="store_true", help="print the (run, seed) pairs and their status")
    parser.add_argument("--replay", type=int, metavar="STEPS",
                        help="re-run the first STEPS steps of each stored result and report every metric that "
                             "differs (the numbers of a refactor must not move)")
    args = parser.parse_args(argv)
    suite = load_suite(args.suite)  # a bad suite raises UserError: one line from rlcurate.cli.main
    names = list(suite["runs"]) if not args.only else [n.strip() for n in args.only.split(",")]
    if args.jobs < 1:
        raise UserError(f"--jobs must be a positive number of runs at a time, got {args.jobs}")
    if len(set(names)) < len(names) or "" in names:
        raise UserError(f"--only must name each run once, got {args.only!r}")
    unknown = [n for n in names if n not in suite["runs"]]
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0], [str(r) for r in suite["runs"]], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UserError(f"--only: unknown run(s) {', '.join(unknown)}{hint}; "
                        f"{args.suite} has {', '.join(map(str, suite['runs']))}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [int(s) for s in suite["seeds"]]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    if len(set(seeds)) < len(seeds):
        raise UserError(f"--seeds must name each seed once, got {args.seeds!r}")
    out = Path(args.out) if args.out else default_out(suite)
    scratch = Path(args.scratch) if args.scratch else default_scratch(suite)
    todo = pending_runs(names, seeds, out, args.force)
    for n in names:  # a bad run config is refused here too, --list included, not listed as "missing"
        run_config(suite, n, seeds[0], scratch)
    finished = [r for n in names for s in seeds if result_is_readable(result_path(out, n, s))
                for r in [read_result(result_path(out, n, s))]]
    if args.list:
        stale = {(r["run"], r["seed"]): stale_changes(suite, r) for r in finished}
        for n in names:
            for s in seeds:
                path = result_path(out, n, s)
                changes = stale.get((n, s))
                status = ("missing" if not path.exists() else "unreadable (will be recomputed)" if changes is None
                          else "done" if not changes else "stale, made with another config ("
                          + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changes.items())) + ")")
                print(f"{n:28s} seed {s}: {status}")
        return 0
    if not args.force:  # a stale result would be paired with current runs: recompute it, or restore the suite
        check_current(suite, finished)
    if args.replay is not None:
        return _replay(names, seeds, out, scratch, args.replay)
    configs = _check_runs(suite, todo, out, scratch, args.force, args.jobs)
    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    if args.force:
        _start_over(configs)
    progress_log = scratch / "progress.log"
    print(f"{len(todo)} run(s) to make in {out} ({args.jobs} at a time); progress also in {progress_log}", flush=True)
    failures, stopped, made = [], [], []
    progress = SuiteProgress(len(todo), args.jobs, progress_log, write=lambda line: print(line, flush=True))

    def work(item):
        n, s = item
        if _STOP.requested:  # asked to stop: start nothing new
            return
        t0 = time.perf_counter()
        progress.started(n, s, scratch / f"{n}_s{s}")
        try:
            r = run_one(suite, n, s, out, scratch)
            made.append((n, s))
            final = (r["summary"].get("final_eval") or {}).get("eval/accuracy")
            progress.finished(n, s, time.perf_counter() - t0, final)
        except RunStopped:
            stopped.append((n, s))
            progress.stopped(n, s)
        except Exception as exc:  # keep going: one failed run must not lose the others
            failures.append((n, s, str(exc)))
            progress.failed_run(n, s, str(exc))

    _STOP.signum = None
    with catch_stop_signals(_pass_on, request=_STOP), progress:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(work, todo))
    if _STOP.requested:
        left = len(todo) - len(made) - len(failures)
        raise Stopped(f"{_STOP.name}: {len(stopped)} run(s) stopped at a checkpoint ({', '.join(f'{n} seed {s}' for n, s in stopped) or 'none'}), "
                      f"{left} of {len(todo)} still to make; run the same command again to resume them", 128 + _STOP.signum)
    if failures:
        print(f"{len(failures)} run(s) failed: {[(n, s) for n, s, _ in failures]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # through the command line, so that a user's mistake is one line
    from rlcurate.cli import main as _cli

    raise SystemExit(_cli(["runs", *sys.argv[1:]]))
