"""``rlcurate compare``: chapter 10's paired table from a suite's committed runs, or the learning rate each
arm takes from a validation sweep. The statistics are in :mod:`rlcurate.comparison`; this module only reads
the runs and prints."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from rlcurate._help import ArgumentParser, HelpFormatter, wrap
from rlcurate.comparison import (CURRENCIES, aa_controls, choose_lr, compare_arms, cost, endpoint_values, grid_curve,
                                 ratio_table, spent_at, sweep_table, to_target_values)
from rlcurate.errors import UserError
from rlcurate.experiments import _find, check_current, default_out, load_results, load_suite


def _seed_list(seeds) -> str:
    """``0-7, 9``: sorted seeds, runs of consecutive ones joined."""
    seeds, parts = sorted(int(s) for s in seeds), []
    for s in seeds:
        if parts and s == parts[-1][1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def _amount(x: float) -> str:
    """A budget as the user wrote it: whole numbers in full (99999999, not 1e+08)."""
    return f"{int(x)}" if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def main(argv: Sequence[str] | None = None) -> int:
    """``rlcurate compare``: the tables of chapter 10's protocol from the committed runs of a suite."""
    p = ArgumentParser(prog="rlcurate compare", formatter_class=HelpFormatter,
                       description=wrap("The paired comparison of a suite's arms with its baseline at equal compute "
                                        "(chapter 10), or the learning rate each arm takes from a validation sweep."))
    p.add_argument("--suite", required=True, help="suite YAML (configs/suites/NAME.yaml)")
    p.add_argument("--runs", "--out", dest="runs", metavar="DIR",
                   help="result folder, the --out of rlcurate runs (default data/runs/<suite name>)")
    p.add_argument("--sweep", action="store_true", help="the suite is a learning-rate sweep: print the chosen rates")
    p.add_argument("--baseline", default="uniform", help="the arm every other arm is compared with")
    p.add_argument("--control", action="append",
                   help="an A/A control arm, compared with the baseline outside the Holm family (repeatable; "
                        "replaces the default: every arm named BASELINE_..._aa, such as uniform_aa and "
                        "uniform_order2_aa for the baseline uniform)")
    p.add_argument("--measure", default="final", choices=["final", "area", "cost", "to_target"],
                   help="accuracy at the budget, area under the curve, accuracy at a budget in --currency, or the "
                        "rollouts to the target the suite's endpoint declares (chapter 11: paired ratios)")
    p.add_argument("--currency", default="rollouts", choices=list(CURRENCIES),
                   help="with --measure cost or to_target, the compute axis: generated rollouts; rollouts + rho x "
                        "rollouts trained, sparse (this trainer: non-zero advantages) or dense (verl: every kept "
                        "rollout); generated + trained tokens; optimizer steps (the papers' currency) (chapter 10)")
    p.add_argument("--rho", type=float,
                   help="with --measure cost or to_target and a cost_* currency: the training cost of a rollout "
                        "relative to generating it (default 1; chapter 10 measures 2.44 and 2.79 on the tiny model, "
                        "bench/bench_rho.py)")
    p.add_argument("--budget", type=float, help="budget in the currency (default: the baseline run's max_rollouts, "
                                                "from the suite's run, its overrides or its base config; with --sweep, "
                                                "the one every run has; with --measure cost, what the baseline spends "
                                                "in --budget-rollouts)")
    p.add_argument("--budget-rollouts", type=float, metavar="N",
                   help="with --measure cost: read every arm at what the baseline spends in --currency when it has "
                        "generated N rollouts, the least over its seeds (chapter 10's cost currencies; default: the "
                        "baseline run's max_rollouts)")
    p.add_argument("--plot", metavar="FILE", help="also draw the forest of the table and each arm's mean curve with "
                                                  "its band into FILE (.png, .pdf or .svg)")
    # the options whose defaults are not None start as None here, so that what the user gave can be told apart
    args = p.parse_args(argv, namespace=argparse.Namespace(**{k: None for k in SWEEP_REFUSES_DEFAULTS}))
    if args.sweep:
        given = [flag for flag in SWEEP_REFUSES if getattr(args, flag[2:].replace("-", "_")) is not None]
        if given:
            raise UserError(f"--sweep prints the learning rate each arm takes from a validation sweep; "
                            f"{', '.join(given)} belong{'s' if len(given) == 1 else ''} to the paired comparison, "
                            f"which --sweep does not make (drop {'it' if len(given) == 1 else 'them'}, or --sweep)")
    for key in SWEEP_REFUSES_DEFAULTS:
        if getattr(args, key) is None:
            setattr(args, key, p.get_default(key))
    if args.control and args.baseline in args.control:
        raise UserError(f"--control: {args.baseline!r} is the --baseline; an A/A control is another arm (the "
                        f"baseline's config with another prompt order, such as {args.baseline}_aa)")
    if args.plot:
        _check_plot_path(args.plot)
    if args.rho is not None and (not math.isfinite(args.rho) or args.rho < 0):
        raise UserError(f"--rho must be a finite number >= 0 (training cost of a rollout over generating it), "
                        f"got {args.rho:g}")
    if args.measure not in ("cost", "to_target") and (args.currency != "rollouts" or args.rho is not None):
        raise UserError(f"--currency and --rho choose the compute axis of --measure cost or to_target; --measure "
                        f"{args.measure} reads generated rollouts (add --measure cost)")
    if args.rho is not None and not args.currency.startswith("cost_"):
        raise UserError(f"--rho prices trained rollouts in cost_sparse and cost_dense; --currency {args.currency} "
                        "does not use it")
    args.rho = 1.0 if args.rho is None else args.rho
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise UserError(f"--budget must be a finite number > 0, got {_amount(args.budget)}")
    if args.budget_rollouts is not None:
        if not (math.isfinite(args.budget_rollouts) and args.budget_rollouts > 0):
            raise UserError(f"--budget-rollouts must be a finite number > 0, got {_amount(args.budget_rollouts)}")
        if args.measure != "cost" or args.budget is not None:
            raise UserError("--budget-rollouts sets the budget of --measure cost from the baseline's rollouts; it "
                            "goes with --measure cost and without --budget")
    suite = load_suite(args.suite)
    folder = Path(args.runs) if args.runs else default_out(suite)
    results = load_results(folder, suite=suite["name"])
    if not results:
        where = "" if folder.is_absolute() else f" (read from the current folder {Path.cwd()}; --runs names another)"
        raise UserError(f"no results of suite {suite['name']!r} in {folder}{where}")
    check_current(suite, results)
    if args.measure in ("cost", "to_target"):
        for r in results:
            try:
                cost(r, args.currency, args.rho)
            except ValueError as exc:  # a run made before the trainer logged what the currency counts
                raise UserError(f"--currency {args.currency}: {exc}") from None
    budget = args.budget
    if budget is None and args.budget_rollouts is None:  # --budget-rollouts N sets the budget of --measure cost
        budget = _default_budget(suite, args)
    spent_note = ""
    priced = args.measure == "cost" or (args.measure == "to_target" and args.currency != "rollouts")
    if args.budget is None and priced:
        budget, spent_note = _baseline_spend(results, args, args.budget_rollouts or budget)
    reached = max(m.get("total/rollouts", 0) for r in results for m in r["metrics"])
    if args.currency == "rollouts" and budget > reached:
        what = f"--budget {_amount(budget)}" if args.budget is not None else (
            f"the budget {_amount(budget)}, the max_rollouts of " + ("every run" if args.sweep else f"run {args.baseline!r}"))
        raise UserError(f"{what}: no run of suite {suite['name']!r} reaches it (the largest reaches {reached:g} "
                        f"rollouts){'' if args.budget is not None else '; pass a smaller --budget'}")
    if args.sweep:
        try:
            table = sweep_table(results, budget)
        except ValueError as exc:  # a run without evaluations on the rollout grid
            raise UserError(f"--sweep at {_amount(budget)}: {exc}") from None
        chosen = {arm: choose_lr(scores) for arm, scores in table.items()}
        for arm, scores in table.items():
            cells = "  ".join(f"lr {lr:g}: {np.mean(v):.3f} ({len(v)})" for lr, v in sorted(scores.items()))
            print(f"{arm:<20} {cells}   -> {chosen[arm]:g}")
        print(json.dumps(chosen))
        return 0
    if args.measure == "to_target":
        if "endpoint" not in suite or suite["endpoint"]["primary"] != "rollouts_to_target":
            raise UserError(f"--measure to_target: suite {args.suite} declares no rollouts_to_target endpoint "
                            "(an 'endpoint:' key with close_gap or target)")
        try:
            values = to_target_values(results, suite["endpoint"], currency=args.currency, rho=args.rho)
        except ValueError as exc:  # a run that stopped before its end without reaching the target
            raise UserError(f"--measure to_target: {exc}") from None
    else:
        try:
            values = endpoint_values(results, args.measure, budget, args.currency, args.rho)
        except ValueError as exc:  # a run that was not read as far as the budget
            raise UserError(f"--measure {args.measure} at {_amount(budget)}: {exc}"
                            + (" (a smaller --budget or --budget-rollouts reads every run)"
                               if "less than the budget" in str(exc) else "")) from None
    if args.baseline not in values:
        sweep = " (a learning-rate sweep? then pass --sweep)" if any("_lr" in arm for arm in values) else ""
        raise UserError(f"--baseline {args.baseline!r} has no runs; arms: {', '.join(values)}{sweep}")
    unknown = [c for c in args.control or [] if c not in values]
    if unknown:
        raise UserError(f"--control: no arm {', '.join(map(repr, unknown))} in the runs; arms: {', '.join(values)}")
    # a suite still running: an arm enters the table only with every seed the baseline has
    base_seeds = set(values[args.baseline])
    pending = {arm: len(set(v) & base_seeds) for arm, v in values.items() if not base_seeds <= set(v)}
    pending.update({arm: 0 for arm in suite["runs"] if arm not in values})  # an arm with no result yet is said too
    if pending:
        finished = ", ".join(f"{arm} {n}" for arm, n in pending.items())
        if all(arm in pending for arm in values if arm != args.baseline):  # a table of the baseline alone
            raise UserError(f"--baseline {args.baseline!r}: no arm has all of its {len(base_seeds)} seeds "
                            f"({_seed_list(base_seeds)}), which pairing needs; seeds finished of those: {finished} "
                            f"(a suite still running: rlcurate runs --suite {args.suite} finishes them)")
        print(f"not in the table, seeds finished of {args.baseline}'s {len(base_seeds)}: {finished}")
        values = {arm: v for arm, v in values.items() if arm not in pending}
    missing = sorted({int(x) for x in suite["seeds"]} - base_seeds)
    if missing and len(base_seeds) >= 2:
        print(f"the baseline {args.baseline} has {len(base_seeds)} of the suite's {len(suite['seeds'])} seeds (not "
              f"{', '.join(map(str, missing))}): every arm is paired over those")
    if len(base_seeds) < 2:
        raise UserError(f"--baseline {args.baseline!r} has {len(base_seeds)} finished seed(s); a paired comparison "
                        f"needs 2 or more (rlcurate runs --suite {args.suite} makes them)")
    controls = args.control if args.control is not None else aa_controls(values, args.baseline)
    family = len([a for a in values if a != args.baseline and a not in controls])
    if args.measure == "to_target":
        ratios = ratio_table(values, args.baseline, budget=budget, controls=controls)
        end = suite["endpoint"]
        goal = f"accuracy {end['target']:g}" if "target" in end else f"the start accuracy + {end['close_gap']:g} of its gap to 1"
        rho = f", rho {args.rho:g}" if args.currency.startswith("cost_") else ""
        spent = "rollouts" if args.currency == "rollouts" else f"{args.currency} ({CURRENCIES[args.currency]}{rho})"
        print(f"{spent} until {goal}; paired ratios to {args.baseline} (a run that reaches it past the budget, or "
              f"never, counts at {budget:,.0f}{spent_note}, censored)")
        print(f"{'arm':<20}{'seeds':>6}{'ratio':>8}{'95% interval':>18}{'p (t)':>8}{'p (Holm)':>10}{'saves at most':>15}"
              f"{'censored':>10}")
        for arm, r in ratios.items():
            holm = f"{r.p_holm:>10.3f}" if arm not in controls else f"{'(control)':>10}"
            print(f"{arm:<20}{r.n:>6}{r.ratio:>8.2f}{f'[{r.low:.2f}, {r.high:.2f}]':>18}{r.p_t:>8.3f}{holm}"
                  f"{r.saving_text:>15}{r.censored:>10d}")
        print(f"(Holm across the {family} arm(s) that are not A/A controls; saves at most: 1 - the one-sided 95% "
              f"lower bound of the ratio, the largest saving the data do not exclude)")
        _control_note({a: not r.covers_one for a, r in ratios.items() if a in controls}, null="1")
        _plot(args, {a: r for a, r in ratios.items() if a != args.baseline}, results, controls, suite, ratio=True)
        return 0
    table = compare_arms(values, args.baseline, args.control)
    if args.measure == "cost":
        rho = f", rho {args.rho:g}" if args.currency.startswith("cost_") else ""
        print(f"accuracy at {args.currency} {budget:,.0f} ({CURRENCIES[args.currency]}{rho}){spent_note}; paired "
              f"differences to {args.baseline}")
    elif args.measure == "final":
        grids = [grid_curve(r).grid for r in results if r["seed"] in values.get(r["run"], {})]
        read = sorted({float(g[g >= budget][0]) for g in grids})  # at_budget's reading
        at = f"{budget:,.0f} rollouts" if read == [budget] else (
            f"{', '.join(f'{g:,.0f}' for g in read)} rollouts, the first evaluation at or past the budget "
            f"{_amount(budget)}")
        print(f"final at {at}; paired differences to {args.baseline}")
    else:
        print(f"{args.measure} at {budget:,.0f} rollouts; paired differences to {args.baseline}")
    if args.measure != "final":  # the end point reads an evaluation; area and cost interpolate between them
        _early_note(results, args, budget)
    print(f"{'arm':<20}{'seeds':>6}{'mean':>8}{'diff':>9}{'95% interval':>20}{'p (t)':>8}{'p (sign)':>10}{'p (Holm)':>10}")
    base = values[args.baseline]
    print(f"{args.baseline:<20}{len(base):>6}{np.mean(list(base.values())):>8.3f}")
    for arm, r in table.items():
        holm = f"{r.p_holm:>10.3f}" if arm not in controls else f"{'(control)':>10}"
        mean = np.mean([v for seed, v in values[arm].items() if seed in base])  # over the paired seeds
        print(f"{arm:<20}{r.n:>6}{mean:>8.3f}{r.mean:>+9.3f}"
              f"{f'[{r.low:+.3f}, {r.high:+.3f}]':>20}{r.p_t:>8.3f}{r.p_sign_flip:>10.3f}{holm}")
    print(f"(Holm across the {family} arm(s) that are not A/A controls)")
    _control_note({a: not r.covers_zero for a, r in table.items() if a in controls})
    _plot(args, table, results, controls, suite)
    return 0


def _early_note(results, args, budget: float) -> None:
    """Warn where the budget comes before a run's first evaluation after the start: its value there is a straight
    line from the start, not a measurement."""
    currency = args.currency if args.measure == "cost" else "rollouts"
    first = min(c[c > 0].min() for r in results for c in [cost(r, currency, args.rho)[0]] if (c > 0).any())
    if budget < first:
        print(f"warning: the budget {budget:,.0f} comes before the first evaluation after the start ({first:,.0f} in "
              f"{currency}); every value is a straight-line reading from the start, not a measurement")


def _control_note(failed: dict[str, bool], null: str = "zero") -> None:
    """What an A/A control says about the table: the same arm twice must cover no difference (chapter 10), a
    ratio of 1 for rollouts to a target (``null="1"``)."""
    bad = [a for a, f in failed.items() if f]
    what = "difference" if null == "zero" else "ratio"
    if bad:
        print(f"warning: the interval of the A/A control {', '.join(bad)} excludes {null}, though it differs from the "
              f"baseline only in prompt order: the seeds vary more than the intervals assume, so a {what} of that size "
              f"in any arm is not evidence; add seeds or model the order (chapter 10)")
    elif failed:
        print(f"A/A control{'s' if len(failed) > 1 else ''} {', '.join(failed)}: "
              f"{'each interval covers' if len(failed) > 1 else 'its interval covers'} {null}, as it should")


PLOT_FORMATS = (".png", ".pdf", ".svg")

SWEEP_REFUSES = ("--baseline", "--control", "--measure", "--currency", "--rho", "--budget-rollouts", "--plot")
"""The options of the paired comparison, refused with ``--sweep`` (which would ignore them)."""
SWEEP_REFUSES_DEFAULTS = ("baseline", "measure", "currency")
"""Those of them whose defaults are not None."""


def _default_budget(suite, args) -> float:
    """The budget when neither --budget nor --budget-rollouts is given: the baseline run's max_rollouts as its
    config resolves it (``rlcurate.experiments.run_config``: the run's own, else the suite's overrides', else the
    base config's); with --sweep, the one max_rollouts every run resolves to. A :class:`UserError` says which flag
    to pass when there is none."""
    base: list[dict] = []  # the base config, read only when a run and the overrides leave max_rollouts to it

    def resolved(run: str):
        over = {**suite["overrides"], **(suite["runs"].get(run) or {})}
        if "max_rollouts" in over:
            return over["max_rollouts"]
        if not base:
            from rlcurate.train.config import read_yaml

            data = read_yaml(_find(suite["base"], Path(suite["_path"])), what="base config")
            base.append(data if isinstance(data, dict) else {})
        return base[0].get("max_rollouts")

    flag = "--budget-rollouts N (or --budget)" if args.measure == "cost" else "--budget"
    if args.sweep:
        values = {run: resolved(run) for run in suite["runs"]}
        if len(set(map(repr, values.values()))) > 1:
            raise UserError(f"suite {args.suite}: the runs have different max_rollouts ("
                            + ", ".join(f"{run} {v}" for run, v in values.items()) + f"): pass {flag}")
        value, whose = next(iter(values.values())), "its runs"
    else:
        value, whose = resolved(args.baseline), f"the baseline run {args.baseline!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        said = (f"sets no max_rollouts for {whose} (neither the run, the suite's overrides nor the base config "
                f"{suite['base']})" if not value else f"sets max_rollouts {value!r} for {whose}, not a number of rollouts")
        raise UserError(f"suite {args.suite} {said}: pass {flag}")
    return float(value)


def _baseline_spend(results, args, rollouts: float) -> tuple[float, str]:
    """The budget of ``--measure cost``: what the baseline has spent in ``--currency`` when it has generated
    ``rollouts``, the least over its seeds (chapter 10 reads each cost currency at what uniform GRPO spends in the
    main budget's rollouts), and the phrase that says so."""
    runs = [r for r in results if r["run"] == args.baseline]
    if not runs:
        arms = ", ".join(sorted({r["run"] for r in results}))
        raise UserError(f"--baseline {args.baseline!r} has no runs; arms: {arms}")
    short = sorted(r["seed"] for r in runs if cost(r, "rollouts")[0][-1] < rollouts)
    if short:
        what = (f"--budget-rollouts {rollouts:g}" if args.budget_rollouts is not None else
                f"--measure cost reads the budget where the baseline has generated its max_rollouts, {rollouts:g}")
        raise UserError(f"{what}: the baseline {args.baseline!r} stops short of it in seed(s) "
                        f"{', '.join(map(str, short))}" + ("" if args.budget_rollouts is not None else
                                                            "; pass a smaller --budget-rollouts (or --budget)"))
    spend = min(spent_at(r, args.currency, args.rho, rollouts) for r in runs)
    return spend, f", what {args.baseline} spends in {rollouts:,.0f} generated rollouts (the least over its seeds)"


def _check_plot_path(path: str) -> None:
    """Refuse a --plot file that cannot be written before any work: its format and its folder."""
    p = Path(path)
    if p.suffix.lower() not in PLOT_FORMATS:
        raise UserError(f"--plot {path}: give a file ending in {', '.join(PLOT_FORMATS)}")
    if not p.parent.is_dir():
        raise UserError(f"--plot {path}: folder {p.parent} does not exist")


def _plot(args, table, results, controls, suite, ratio: bool = False) -> None:
    if not args.plot:
        return
    from rlcurate.book.paired import plot_comparison

    kept = [r for r in results if r["run"] in set(table) | {args.baseline}]
    plot_comparison(table, kept, args.baseline, controls, suite["name"], args.plot, ratio=ratio)
    print(f"wrote {args.plot}")
