"""The conditions map of chapter 11 (*When does curation pay?*) in the simulated world (a program over
:mod:`rlcurate.sim`, like :mod:`rlcurate.experiments` over the trainer).

A *conditions suite* (``configs/suites/conditions_sim.yaml``) names a base world and training set-up,
the arms, the conditions (each a change of the pool's pass-rate distribution, of the group size at
equal rollouts per step, or of the budget) and the endpoint, declared before any run:

* **primary**: charged rollouts until the held-out mean pass rate closes ``close_gap`` of the gap to 1
  it starts with, target = p0 + close_gap (1 - p0) (0.5: the held-out error halved), read per step
  (the simulated world evaluates exactly after every step, so the crossing is resolved to one step's
  rollouts, 1 % of the budget); each arm over uniform as a paired ratio
  (:func:`rlcurate.comparison.ratio_table`);
* secondary: the held-out pass rate at the budget, and the area under the curve.

Chapter 10's protocol, in every condition: the learning rate of every arm but the A/A control chosen
on validation worlds (the validation split, by area under the curve), the A/A control at uniform's
rate, then paired seeds on the test split: seed s is one world (its pool, split and sampling streams)
shared by every arm (common random numbers).

``rlcurate conditions --suite configs/suites/conditions_sim.yaml`` runs every condition that has no
result yet and writes ``data/runs/<suite>/<condition>.json``; :func:`condition_table` reads one.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlcurate.errors import UserError

__all__ = ["load_conditions", "condition_config", "run_costs", "run_curve", "run_condition", "condition_table",
           "read_condition", "main"]

SUITE_KEYS = {"name", "world", "train", "budget", "lrs", "validation_seeds", "seeds", "endpoint", "arms",
              "conditions"}
CONDITION_KEYS = {"pass_rate_beta", "group_size", "budget", "n_prompts"}
ARM_KEYS = {"strategy", "strategy_kwargs", "advantage", "order_offset", "lr_of", "group_size"}
TRAIN_KEYS = {"rollouts_per_step", "group_size", "optimizer", "validation_fraction", "test_fraction"}
ENDPOINT = {"primary": "rollouts_to_target", "secondary": ["final", "area"]}  # what _measures reads
CURVE_POINTS = 51  # the curve stored per run, for plots (the endpoint is read on every step)


def load_conditions(path: str | Path) -> dict[str, Any]:
    """Read and check a conditions suite; errors name the file and the key."""
    from rlcurate.train.config import read_yaml

    path = Path(path)
    suite = read_yaml(path, what="conditions suite")
    if not isinstance(suite, dict):
        raise UserError(f"{path}: a conditions suite must be a mapping")
    missing = sorted(SUITE_KEYS - set(suite))
    unknown = sorted(set(suite) - SUITE_KEYS)
    if missing or unknown:
        raise UserError(f"{path}: " + "; ".join(
            ([f"missing key(s) {', '.join(missing)}"] if missing else []) +
            ([f"unknown key(s) {', '.join(map(str, unknown))}"] if unknown else [])))
    for key in ("arms", "conditions", "world", "train", "endpoint"):
        if not isinstance(suite[key], dict) or (key in ("arms", "conditions") and not suite[key]):
            raise UserError(f"{path}: {key} must be a non-empty mapping")
    if "uniform" not in suite["arms"]:
        raise UserError(f"{path}: arms must hold 'uniform', the baseline")
    for kind, allowed in (("arm", ARM_KEYS), ("condition", CONDITION_KEYS)):
        for name, spec in suite[kind + "s"].items():
            bad = sorted(set(spec or {}) - allowed)
            if bad:
                raise UserError(f"{path}: {kind} {name!r}: unknown key(s) {', '.join(bad)}; a {kind} sets "
                                f"{', '.join(sorted(allowed))}")
    for name, arm in suite["arms"].items():
        if (arm or {}).get("lr_of") is not None and arm["lr_of"] not in suite["arms"]:
            raise UserError(f"{path}: arm {name!r}: lr_of names no arm ({arm['lr_of']!r})")
    gap = suite["endpoint"].get("close_gap")
    if not isinstance(gap, (int, float)) or not 0 < gap < 1:
        raise UserError(f"{path}: endpoint.close_gap must lie in (0, 1), got {gap!r}")
    for key in ("lrs", "seeds", "validation_seeds"):
        if not isinstance(suite[key], list) or not suite[key]:
            raise UserError(f"{path}: {key} must be a non-empty list")
    suite["_path"] = str(path)
    _check_values(suite)
    return suite


def _check_values(suite: dict[str, Any]) -> None:
    """Every value of a suite checked before any run: the numbers' types and ranges, then each condition's
    set-up and each arm's trainer built once (world, strategy and its options, advantage, optimizer,
    splits), so that a misspelt value is refused in one line, not found after other arms' sweeps."""
    from rlcurate._validate import as_finite, as_int

    path = suite["_path"]

    def check(what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as exc:
            raise UserError(f"{path}: {what}: {exc}") from None

    if not isinstance(suite["name"], str) or not suite["name"] or Path(suite["name"]).name != suite["name"]:
        raise UserError(f"{path}: name must be a folder name (no '/'), got {suite['name']!r}")
    unknown = sorted(set(suite["train"]) - TRAIN_KEYS)
    if unknown or "rollouts_per_step" not in suite["train"] or "group_size" not in suite["train"]:
        raise UserError(f"{path}: train sets {', '.join(sorted(TRAIN_KEYS))} (rollouts_per_step and group_size "
                        f"required); got {', '.join(map(str, suite['train'])) or 'none'}")
    for key in ("rollouts_per_step", "group_size"):
        check(f"train.{key}", as_int, suite["train"][key], key, minimum=1)
    for key in ("validation_fraction", "test_fraction"):
        check(f"train.{key}", as_finite, suite["train"].get(key, 0.1), key, nonnegative=True)
    check("budget", as_int, suite["budget"], "budget", minimum=1)
    for r in suite["lrs"]:
        check("lrs", as_finite, r, "a learning rate", positive=True)
    for key in ("seeds", "validation_seeds"):
        for seed in suite[key]:
            check(key, as_int, seed, "a seed", minimum=0)
        if len(set(suite[key])) != len(suite[key]):
            raise UserError(f"{path}: {key} repeats a seed")
    if set(suite["seeds"]) & set(suite["validation_seeds"]):
        raise UserError(f"{path}: seeds and validation_seeds share {sorted(set(suite['seeds']) & set(suite['validation_seeds']))}; "
                        "the learning rate must be chosen on worlds the test does not use")
    endpoint = suite["endpoint"]
    secondary = endpoint.get("secondary", [])
    if (set(endpoint) - {"primary", "close_gap", "secondary"} or endpoint.get("primary") != ENDPOINT["primary"]
            or not isinstance(secondary, list) or not set(secondary) <= set(ENDPOINT["secondary"])):
        raise UserError(f"{path}: endpoint must be {{primary: {ENDPOINT['primary']}, close_gap: <in (0, 1)>, "
                        f"secondary: [{', '.join(ENDPOINT['secondary'])}] or some of them}} (what this program "
                        f"measures); got {endpoint}")
    for kind, minima in (("condition", {"budget": 1, "group_size": 1}), ("arm", {"order_offset": 0, "group_size": 1})):
        for name, spec in suite[kind + "s"].items():
            for key, low in minima.items():
                if key in (spec or {}):
                    check(f"{kind} {name!r}: {key}", as_int, spec[key], key, minimum=low)
    for name, cond in suite["conditions"].items():
        beta = (cond or {}).get("pass_rate_beta", [0, 0])
        if not isinstance(beta, list) or len(beta) != 2:
            raise UserError(f"{path}: condition {name!r}: pass_rate_beta must be two numbers [a, b], got {beta!r}")
    for name, arm in suite["arms"].items():
        if not isinstance((arm or {}).get("strategy_kwargs", {}), dict):
            raise UserError(f"{path}: arm {name!r}: strategy_kwargs must be a mapping")
    seed, lr = int(suite["validation_seeds"][0]), float(suite["lrs"][0])
    for name in suite["conditions"]:
        setup = condition_config(suite, name)
        check(f"condition {name!r}", _world, setup, seed)
        for arm in suite["arms"]:
            for split in ("validation", "test"):
                check(f"condition {name!r}, arm {arm!r}", _trainer, suite, setup, arm, seed, lr, split)


def condition_config(suite: dict[str, Any], condition: str) -> dict[str, Any]:
    """The set-up of one condition: the base world and training options with the condition's changes;
    ``prompts_per_step`` is the rollouts per step over the group size (equal rollouts per step)."""
    cond = suite["conditions"][condition] or {}
    world = dict(suite["world"])
    if "pass_rate_beta" in cond:
        world["pass_rate_beta"] = tuple(cond["pass_rate_beta"])
    if "n_prompts" in cond:
        world["n_prompts"] = int(cond["n_prompts"])
    train = dict(suite["train"])
    G = int(cond.get("group_size", train["group_size"]))
    per_step = int(train["rollouts_per_step"])
    if G < 1 or per_step < 1:
        raise UserError(f"{suite['_path']}: condition {condition!r}: group_size {G} and rollouts_per_step {per_step} "
                        "must be positive")
    if per_step % G:
        raise UserError(f"{suite['_path']}: condition {condition!r}: rollouts_per_step {per_step} is not a "
                        f"multiple of the group size {G}")
    train.update(group_size=G, prompts_per_step=per_step // G)
    return {"world": world, "train": train, "budget": int(cond.get("budget", suite["budget"]))}


def _world(setup: dict[str, Any], seed: int):
    from rlcurate.sim.world import SoftmaxWorld

    return SoftmaxWorld.make(**setup["world"], seed=seed)


def _trainer(suite, setup, arm: str, seed: int, lr: float, split: str):
    from rlcurate.curation.registry import build_curator
    from rlcurate.sim.bridge import SimTrainer

    spec = suite["arms"][arm] or {}
    train = setup["train"]
    G = int(spec.get("group_size", train["group_size"]))  # an arm's own group size at equal rollouts per step
    if G < 1:
        raise UserError(f"{suite['_path']}: arm {arm!r}: group_size {G} must be positive")
    if train["rollouts_per_step"] % G:
        raise UserError(f"{suite['_path']}: arm {arm!r}: rollouts_per_step {train['rollouts_per_step']} is not a "
                        f"multiple of its group size {G}")
    return SimTrainer(_world(setup, seed), build_curator(spec.get("strategy", "uniform"), **spec.get("strategy_kwargs", {})),
                      prompts_per_step=train["rollouts_per_step"] // G, group_size=G, lr=lr,
                      advantage=spec.get("advantage", "grpo"), seed=seed, optimizer=train.get("optimizer", "adam"),
                      validation_fraction=train["validation_fraction"], test_fraction=train["test_fraction"],
                      eval_split=split, order_offset=int(spec.get("order_offset", 0)))


def run_costs(suite, setup, arm: str, seed: int, lr: float, split: str = "test",
              close_gap: float | None = None) -> dict[str, np.ndarray]:
    """One run after every step, from 0 to the first step at or past the budget (or, with ``close_gap``, to
    the first step whose held-out pass rate reaches ``target``, the start plus that share of its gap to 1):
    cumulative ``rollouts`` charged, ``kept`` (the rollouts of the groups trained, every one of which a dense
    trainer such as verl trains on) and ``mixed`` (those of mixed groups, the rollouts this trainer trains on),
    and the exact ``held_out`` mean pass rate. Chapter 10's cost currencies are rollouts + rho * kept and
    rollouts + rho * mixed."""
    from rlcurate.comparison import target_of

    tr = _trainer(suite, setup, arm, seed, lr, split)
    rows = [(0, 0, 0, tr.held_out())]
    target = None if close_gap is None else target_of(rows[0][3], {"close_gap": close_gap})
    while tr.rollouts < setup["budget"] and (target is None or rows[-1][3] < target):
        rec = tr.train_step()
        r, k, m, _ = rows[-1]
        rows.append((rec["total_rollouts"], k + rec["kept_samples"], m + rec["mixed_samples"], rec["held_out"]))
    a = np.array(rows, dtype=float)
    out = {"rollouts": a[:, 0], "kept": a[:, 1], "mixed": a[:, 2], "held_out": a[:, 3]}
    if target is not None:
        out["target"] = target
    return out


def run_curve(suite, setup, arm: str, seed: int, lr: float, split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """(charged rollouts, exact held-out mean pass rate) after every step of one run, from 0 to the
    first step at or past the budget."""
    c = run_costs(suite, setup, arm, seed, lr, split)
    return c["rollouts"], c["held_out"]


def _area(x, y, budget) -> float:
    """The area (:func:`rlcurate.comparison.curve_mean`) of the curve read at 101 points from 0 to the budget."""
    from rlcurate.comparison import curve_mean

    grid = np.linspace(0, budget, 101)
    return curve_mean(grid, np.interp(grid, x, y))


def _measures(x, y, budget, close_gap) -> dict[str, Any]:
    from rlcurate.comparison import rollouts_to_target, target_of

    target = target_of(y[0], {"close_gap": close_gap})
    grid = np.linspace(0, budget, CURVE_POINTS)
    return {"to_target": rollouts_to_target(x, y, target), "target": float(target),
            "final": float(np.interp(budget, x, y)), "area": _area(x, y, budget),
            "start": float(y[0]), "curve": np.interp(grid, x, y).round(6).tolist(), "steps": int(len(x) - 1)}


def run_condition(suite: dict[str, Any], condition: str, progress: bool = True,
                  previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweep on validation worlds, then every arm on every test seed, for one condition; with
    ``previous`` (this condition's earlier result, same set-up) only the arms it lacks are run. The
    strategies' per-step warnings (DAPO's "found 0 mixed groups" once a world is solved) are silenced."""
    import logging

    quiet = logging.getLogger("rlcurate.curation")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _run_condition(suite, condition, progress, previous)
    finally:
        quiet.setLevel(level)


def _stored_setup(setup: dict[str, Any]) -> dict[str, Any]:
    """A condition's set-up as its result stores it (tuples as lists)."""
    return {**setup, "world": {k: list(v) if isinstance(v, tuple) else v for k, v in setup["world"].items()}}


def _same_setup(suite: dict[str, Any], condition: str, previous: dict[str, Any]) -> list[str]:
    """What differs between a stored result and the suite (empty: its arms can be kept)."""
    now = {"setup": _stored_setup(condition_config(suite, condition)), "endpoint": suite["endpoint"],
           "lrs": [float(r) for r in suite["lrs"]], "validation_seeds": list(suite["validation_seeds"]),
           "seeds": [str(s) for s in suite["seeds"]]}
    before = {"setup": previous["setup"], "endpoint": previous["endpoint"], "lrs": previous["lrs"],
              "validation_seeds": previous["validation_seeds"], "seeds": list(next(iter(previous["runs"].values())))}
    return [k for k in now if now[k] != before[k]] + [
        f"arm {a}" for a in previous["runs"] if a in suite["arms"] and (suite["arms"][a] or {}) != previous["arms"][a]]


def _run_condition(suite: dict[str, Any], condition: str, progress: bool,
                   previous: dict[str, Any] | None = None) -> dict[str, Any]:
    setup = condition_config(suite, condition)
    budget, gap = setup["budget"], float(suite["endpoint"]["close_gap"])
    t0 = time.perf_counter()
    sweep: dict[str, dict[str, list[float]]] = {}
    lr: dict[str, float] = {}
    kept = [a for a in suite["arms"] if previous and a in previous["runs"]]
    if kept:
        sweep.update({a: previous["sweep"][a] for a in kept if a in previous["sweep"]})
        lr.update({a: float(previous["lr"][a]) for a in kept})
    from rlcurate.comparison import choose_lr

    for arm, spec in suite["arms"].items():
        if (spec or {}).get("lr_of") or arm in kept:
            continue
        sweep[arm] = {str(r): [_area(*run_curve(suite, setup, arm, s, float(r), "validation"), budget)
                               for s in suite["validation_seeds"]] for r in suite["lrs"]}
        lr[arm] = choose_lr({float(r): v for r, v in sweep[arm].items()})
    for arm, spec in suite["arms"].items():
        if (spec or {}).get("lr_of") and arm not in kept:
            lr[arm] = lr[spec["lr_of"]]
    runs = {arm: previous["runs"][arm] if arm in kept else
            {str(s): _measures(*run_curve(suite, setup, arm, s, lr[arm]), budget, gap) for s in suite["seeds"]}
            for arm in suite["arms"]}
    seconds = time.perf_counter() - t0 + (float(previous.get("seconds", 0.0)) if kept else 0.0)
    if progress:
        print(f"{condition}: {len(runs) - len(kept)} arm(s) run, {len(kept)} kept, x {len(suite['seeds'])} seeds "
              f"({seconds:.0f} s in all)", flush=True)
    return {"suite": suite["name"], "condition": condition, "setup": _stored_setup(setup),
            "endpoint": suite["endpoint"], "lrs": [float(r) for r in suite["lrs"]],
            "validation_seeds": list(suite["validation_seeds"]), "arms": {a: suite["arms"][a] or {} for a in runs},
            "lr": lr, "sweep": sweep, "runs": runs, "seconds": seconds}


def condition_table(result: dict[str, Any], measure: str = "to_target", published: dict[str, float] | None = None):
    """The paired table of one condition: for ``to_target`` the ratios over uniform
    (:func:`rlcurate.comparison.ratio_table`), otherwise the differences (:func:`rlcurate.comparison.compare_arms`)."""
    from rlcurate.comparison import compare_arms, ratio_table

    values = {arm: {int(s): (math.inf if m[measure] is None else m[measure]) for s, m in by_seed.items()}
              for arm, by_seed in result["runs"].items()}
    if measure == "to_target":
        return ratio_table(values, "uniform", budget=result["setup"]["budget"], published=published)
    return compare_arms(values, "uniform")


def json_safe(x):
    """``x`` with every non-finite float as None (JSON has no inf or NaN) and numpy scalars as Python numbers."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


RESULT_KEYS = {"setup": dict, "endpoint": dict, "lrs": list, "validation_seeds": list, "arms": dict, "lr": dict,
               "sweep": dict, "runs": dict}
"""The keys of a stored condition result that ``rlcurate conditions`` reads back, with their types."""


def read_condition(path: str | Path) -> dict[str, Any]:
    """A stored condition result (``<out>/<condition>.json``), checked as far as ``rlcurate conditions`` reads it
    to keep its arms: readable JSON, a mapping with :data:`RESULT_KEYS` of their types, ``runs`` a non-empty
    mapping of arm to seeds, each arm of it in ``arms`` and ``lr``. A damaged one (a copy cut short, a file
    edited by hand) raises :class:`UserError` naming the file, what is wrong, and what to do (as
    :func:`rlcurate.experiments.read_result` for a run's result)."""
    path = Path(path)
    remedy = "delete it or pass --force to compute the condition afresh"
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable condition result ({type(exc).__name__}: {exc}); {remedy}") from None
    if not isinstance(result, dict):
        raise UserError(f"{path}: not a condition result, a JSON {type(result).__name__} instead of a mapping; "
                        f"{remedy}")
    wrong = [f"{k} (not a {t.__name__})" if k in result else k for k, t in RESULT_KEYS.items()
             if not isinstance(result.get(k), t)]
    if wrong:
        raise UserError(f"{path}: not a condition result, it lacks {', '.join(wrong)}; {remedy}")
    runs = result["runs"]
    bad = [a for a, by_seed in runs.items() if not isinstance(by_seed, dict) or not by_seed
           or a not in result["arms"] or a not in result["lr"]]
    if not runs or bad:
        what = f"arm(s) {', '.join(map(repr, bad))} without seeds, an entry in arms or a learning rate" if bad else \
            "no arm in runs"
        raise UserError(f"{path}: a damaged condition result, {what}; {remedy}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from rlcurate._help import ArgumentParser, HelpFormatter

    ap = ArgumentParser(prog="rlcurate conditions", formatter_class=HelpFormatter,
                        description="Run the conditions map of chapter 11 in the simulated world: every "
                                    "condition of a conditions suite that has no result yet.")
    ap.add_argument("--suite", required=True, help="a conditions suite (configs/suites/conditions_sim.yaml)")
    ap.add_argument("--out", default=None, help="folder of the results (default: data/runs/<suite name>)")
    ap.add_argument("--only", nargs="+", default=None, help="these conditions only")
    ap.add_argument("--force", action="store_true", help="recompute conditions that have a result")
    args = ap.parse_args(argv)
    suite = load_conditions(args.suite)
    names = args.only or list(suite["conditions"])
    unknown = [n for n in names if n not in suite["conditions"]]
    if unknown:
        raise UserError(f"--only: unknown condition(s) {', '.join(unknown)}; the suite has "
                        f"{', '.join(suite['conditions'])}")
    from rlcurate.experiments import default_out
    from rlcurate.train.preflight import check_out_dir

    out = Path(args.out) if args.out else default_out(suite)
    try:
        check_out_dir(str(out))
    except UserError as exc:
        raise UserError(f"--out: {exc}") from None
    # every stored result is read and checked before any condition runs
    stored = {name: read_condition(out / f"{name}.json") for name in names
              if (out / f"{name}.json").exists() and not args.force}
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / f"{name}.json"
        previous = stored.get(name)
        if previous is not None:
            missing = [a for a in suite["arms"] if a not in previous["runs"]]
            if not missing:
                print(f"{name}: done ({path})")
                continue
            diff = _same_setup(suite, name, previous)
            if diff:
                raise UserError(f"{path}: the suite now differs from this result in {', '.join(diff)}; rerun the "
                                f"condition with --force (arms {', '.join(missing)} are new)")
        result = run_condition(suite, name, previous=previous)
        from rlcurate.provenance import provenance

        result["environment"] = provenance("cpu")
        result["command"] = f"rlcurate conditions --suite {suite['_path']} --only {name} --force"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(json_safe(result), separators=(",", ":")) + "\n")
        tmp.replace(path)
    return 0
