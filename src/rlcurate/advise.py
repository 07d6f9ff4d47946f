"""``rlcurate advise``: from an audit of your own model and data to a decision (chapters 4 and 11).

An audit (``rlcurate audit``, any backend), or a file of pass/fail results from your own evaluation harness
(:func:`load_pool`: ``.jsonl`` or ``.csv``), gives each prompt's successes in N runs. From it:

1. **The pool's pass-rate distribution**, fitted as a mixture of Betas by its marginal likelihood
   (:func:`rlcurate.stats.mixture.fit_beta_mixture`), with its uncertainty from a bootstrap over prompts.
2. **The gate at each group size G**: the share of groups of G rollouts that all get the same reward,
   E[p^G + (1-p)^G], and the mixed groups per 1,000 rollouts, 1000 / G * (1 - that share). For G <= N it
   is *measured* (the unbiased estimate of :func:`rlcurate.stats.group_mixed_prob`); beyond N the audit
   does not identify it and the fitted shape *extrapolates* it.
3. **The ceiling and the strategies, by simulation**: chapter 11's simulated world (the conditions map's
   world, :mod:`rlcurate.conditions`) with its pool's pass rates drawn from this fit (one bootstrap fit
   per seed, so the fit's uncertainty enters the intervals). Uniform GRPO at your G, oracle selection and
   oracle allocation from the exact pass rates (what one good rule does with perfect information, chapter 11's
   "ceiling": a benchmark, not a bound; or, with ``oracle_every``, from pass rates sampled by an uncharged
   audit of the pool every so many rollouts, as the oracles run on a language model), DAPO's
   dynamic sampling, GRESO's pre-rollout filter, and uniform GRPO at the other group sizes at equal
   rollouts per step, each at the learning rate of least rollouts-to-target on a validation world.
   Endpoint: rollouts (and cost, rollouts + rho * rollouts trained) until the held-out pass rate closes
   half its gap to 1, paired over seeds as a ratio to uniform (:func:`rlcurate.comparison.ratio_table`).

What the simulation cannot know is how *your* model learns: it predicts from the pool's shape at the start.
Chapter 11 puts its predictions beside measured runs (the conditions map, the tiny model, SmolLM2) and
says where they part: on language models it was optimistic about small groups and, with exact pass rates,
about selection (with the stale, sampled ones the tiny model's oracles read, ``oracle_every``, its intervals
held both pools' measurements), and its world learns every prompt through shared skills, where a model may
never solve some (``out_of_reach``, ``out_of_reach_from`` give it a floor). The output says so
(:data:`CAVEAT`, and a warning where many audited prompts were never solved).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlcurate.errors import UserError
from rlcurate.stats import mixture
from rlcurate.stats.mixture import BetaMixture, fit_beta_mixture, gate_counts, measured_zero_variance

__all__ = ["Advice", "advise", "never_solved_share", "read_counts", "load_pool", "PoolScores", "SCORES_SUFFIXES", "gate_table", "simulate", "render", "plot", "main",
           "advise_counts", "sim_prompts", "dense_waste", "SIM_WORLD", "SIM_GROUP_SIZES", "MIN_PROMPTS", "MIN_RUNS"]

GROUP_SIZES = mixture.GROUP_SIZES
SIM_GROUP_SIZES = (2, 4, 8, 16, 32)
"""Group sizes the simulation compares at its 128 rollouts per step."""
MIN_PROMPTS = 20
MIN_RUNS = mixture.MIN_RUNS  # the runs a prompt needs to enter the fit (rlcurate.stats.mixture.gate_counts)
MAX_TRIALS = 1_000_000  # runs of one prompt a scores file may claim (each becomes one score in memory)
MAX_TOTAL_TRIALS = 50_000_000  # and of all its prompts together (400 MB of scores)
SIM_WORLD = {"n_prompts": 600, "n_skills": 32, "noise_dims": 16}
"""The conditions map's world (configs/suites/conditions_sim.yaml) less its pass rates."""
SIM_TRAIN = {"rollouts_per_step": 128, "optimizer": "adam", "validation_fraction": 0.1, "test_fraction": 0.2}
SIM_TRAIN_SHARE = 1 - SIM_TRAIN["validation_fraction"] - SIM_TRAIN["test_fraction"]
SIM_TRAIN_PROMPTS = round(SIM_WORLD["n_prompts"] * SIM_TRAIN_SHARE)
"""The most training prompts the simulated world holds (420)."""
SIM_MIN_WORLD = 40
"""The fewest prompts a simulated world holds (28 of them training prompts), whatever the pool."""
SIM_LRS = (0.3, 1.0, 3.0)
SIM_CLOSE_GAP = 0.5
SIM_BUDGET = 51200
"""The simulation's cap on a run's rollouts (a run that has not reached its target by then counts as
reaching it there, which understates its ratio)."""
NEVER_SOLVED_WARN = 0.1
"""The share of audited prompts never solved above which advise warns that its world (which learns every prompt
through shared skills) is likely optimistic."""
CAVEAT = ("predictions of a simulated world built from the pool's starting shape, not measurements: on language "
          "models they were optimistic about selection and small groups (chapter 11) and about a sampler's cost "
          "(chapter 10: DAPO indistinguishable from uniform in accuracy at a dense-cost budget on the tiny model, where they "
          "predicted a saving in cost to a target); "
          "before acting on one, confirm it with a paired run under chapter 10's protocol (a learning-rate sweep per "
          "arm, paired seeds with an A/A arm, a declared endpoint; rlcurate runs and rlcurate compare)")
STRATEGY_ARMS = {"oracle_select": {"strategy": "oracle_select"}, "oracle_alloc": {"strategy": "oracle_alloc"},
                 "dapo": {"strategy": "dapo"}, "greso": {"strategy": "greso"}}
CEILING_ARMS = ("oracle_select", "oracle_alloc")
SKIP_ARM = "uniform_skip_zero"
"""Uniform GRPO with dense training except for the groups whose advantage is zero (``--training dense``)."""
SKIP_RIVALS = {"dapo": "DAPO", "greso": "GRESO's filter"}
"""The samplers that save dense cost by training only mixed groups, set against :data:`SKIP_ARM` (arm: name)."""
SKIP_NOTE = ("a zero advantage adds nothing to the policy gradient with a group-mean baseline and no KL or entropy "
             "term: skip those rollouts' forward and backward within each mini-batch, keeping them in its loss "
             "normaliser, and every mini-batch's gradient is unchanged")
"""What makes skipping free, and its conditions (chapter 10, *What a dense trainer should do at rho = 5*)."""
SKIP_OPTIONS = ("in verl 0.9: +data.sampler.skip_zero_advantage=true on rlcurate's registered trainer (exact only with "
                "one mini-batch and one epoch per batch and no KL loss, KL reward or entropy bonus: the hook refuses other "
                "settings); "
                "in TRL 1.16: the mixin rlcurate.interop.trl_skip.ZeroAdvantageSkipping (appendix A2)")
ORACLE_RUNS = 8
"""Runs per prompt of the oracles' audit when ``oracle_every`` is given (chapter 11's language-model oracles)."""


@dataclass
class Advice:
    """What :func:`advise` found; :meth:`to_dict` is the JSON, :func:`render` the text."""

    audit: str
    prompts: int
    runs: int
    pass_rate: dict[str, float]
    fit: BetaMixture
    gate: list[dict[str, Any]]
    budget: int
    pool: int
    group_size: int
    rho: float
    training: str
    sim: dict[str, Any] | None
    verdict: str
    dense_waste: dict[str, Any] | None = None
    """With dense training (and rho > 0), the share of a step's cost that trains groups without signal at the
    start, from the audit's gate (:func:`dense_waste`); None otherwise."""
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    shares: np.ndarray | None = None
    """The audit's per-prompt shares k / n (for the plot; not in the JSON)."""

    @property
    def predicted(self) -> bool:
        """Whether the simulation ran and reached its target (so it predicts ratios)."""
        return bool(self.sim) and not self.sim.get("unreached")

    def to_dict(self) -> dict[str, Any]:
        from rlcurate.conditions import json_safe

        return json_safe({"format": "rlcurate-advice/1", "audit": self.audit, "prompts": self.prompts,
                        "runs": self.runs, "pass_rate": self.pass_rate, "fit": self.fit.to_dict(),
                        "gate": self.gate, "budget": self.budget, "pool": self.pool,
                        "group_size": self.group_size, "rho": self.rho, "training": self.training,
                        "simulation": self.sim, "dense_waste": self.dense_waste, "verdict": self.verdict,
                        "warnings": self.warnings,
                        "caveat": CAVEAT if self.predicted else None,
                        "seconds": self.seconds})


# ---------------------------------------------------------------------------------------------- input
SCORES_SUFFIXES = (".jsonl", ".csv")
"""Files of pass/fail results that advise reads in place of an audit folder (:func:`load_pool`)."""


@dataclass
class PoolScores:
    """Per prompt, its id and its runs' scores (in [0, 1]), read from an audit folder or a scores file, with
    what weakens them; ``limit`` is an audit's ``--limit`` (``None`` for a file)."""
    uids: list[str]
    scores: list[np.ndarray]
    warnings: list[str] = field(default_factory=list)
    limit: int | None = None
    numbered: bool = False  # some prompts had no id: their position in the file (1, 2, ...) stands for it


def load_pool(source) -> PoolScores:
    """An audit folder (``rlcurate audit --out``, any backend) or a file of your own evaluation's pass/fail
    results, one prompt per line or row, in any harness's words:

    * ``.jsonl``: ``{"uid": "q17", "rewards": [1, 0, 0, 1]}`` (``scores`` for ``rewards``, ``id`` for ``uid``
      also read; other keys ignored), or ``{"uid": "q17", "successes": 2, "trials": 4}`` (``n_runs`` for
      ``trials``: an audit's ``samples.jsonl`` is read too);
    * ``.csv``: a header with ``successes`` and ``trials`` (and ``uid``, optional).

    Without an id, a prompt's position among the file's prompts (1, 2, ...; blank lines and the header not
    counted, so a .jsonl and a .csv of the same prompts agree) is its id. Refuses, in one line naming the file and
    line, what is not one of these (:class:`UserError`)."""
    path = Path(source)
    if path.suffix.lower() in SCORES_SUFFIXES and not path.is_dir():
        return _read_scores_file(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: a file, not an audit folder (give the folder an `rlcurate audit --out` wrote, or "
                        f"a scores file ending in {' or '.join(SCORES_SUFFIXES)})")
    if not path.is_dir():
        raise UserError(f"{path}: no such folder (give the folder an `rlcurate audit --out` wrote)")
    missing = [f for f in ("config.json", "runs.jsonl") if not (path / f).is_file()]
    if missing:
        what = " and ".join(f"{f} {'is not a file' if (path / f).exists() else 'is missing'}" for f in missing)
        raise UserError(f"{path}: not an audit folder ({what}; make one with `rlcurate audit --out {path}`)")
    from rlcurate.audit.summary import INVALIDATING_SHARE, load_audit

    audit = load_audit(path)
    warnings = []
    runs = sum(s.size for s in audit.scores)
    if audit.scores and not audit.complete:
        audited = sum(s.size >= MIN_RUNS for s in audit.scores)
        warnings.append(f"the audit is unfinished: {runs} of {audit.n_samples * int(audit.config['runs'])} runs "
                        f"({audited} of {audit.n_samples} prompts with {MIN_RUNS} or more)")
    errors = sum(int(e.sum()) for e in audit.errors)
    cut = sum(sum(f == "length" and v < 1 for f, v in zip(fr, s)) for fr, s in zip(audit.finish_reasons, audit.scores))
    for what, count in (("had a failing reward function", errors), ("hit the token limit and failed", cut)):
        if runs and count > INVALIDATING_SHARE * runs:
            warnings.append(f"{count / runs:.0%} of the runs {what}: the audit measures that more than the data")
    return PoolScores(audit.uids, audit.scores, warnings, audit.config.get("limit"))


def _read_scores_file(path: Path) -> PoolScores:
    if not path.is_file():
        raise UserError(f"{path}: no such file (a scores file: one prompt per line of .jsonl, or a .csv with "
                        f"successes and trials columns)")
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a spreadsheet's "CSV UTF-8" starts with a byte-order mark
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    rows = _jsonl_rows(path, text) if path.suffix.lower() == ".jsonl" else _csv_rows(path, text)
    if not rows:
        raise UserError(f"{path}: no prompts in it")
    seen: dict[str, int] = {}
    uids = []
    for position, (line, uid, _) in enumerate(rows, start=1):
        uid = str(position) if uid is None else uid
        if uid in seen:
            raise UserError(f"{path}: line {line}: uid {uid!r} again (first on line {seen[uid]}); one line per prompt")
        seen[uid] = line
        uids.append(uid)
    return PoolScores(uids, [s for _, _, s in rows], numbered=any(u is None for _, u, _ in rows))


def _whole(v) -> str:
    """A count for a message: with thousands separators, or its number of digits when it is huge."""
    n = int(v)
    return f"{n:,}" if n < 10 ** 15 else f"a number of {len(str(n))} digits"


def _counts_scores(where: str, successes, trials, budget: "_TrialBudget") -> np.ndarray:
    """Runs of a prompt given as counts: ``successes`` ones and ``trials - successes`` zeros (advise reads only
    their number and sum)."""
    for name, v in (("successes", successes), ("trials", trials)):
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                or (isinstance(v, float) and not v.is_integer())):  # an int of any size is whole
            raise UserError(f"{where}: {name} must be a whole number >= 0, got {v!r:.40}")
    if trials > MAX_TRIALS:
        raise UserError(f"{where}: trials {_whole(trials)} is more than {MAX_TRIALS:,} runs of one prompt")
    if successes > trials:
        raise UserError(f"{where}: successes {_whole(successes)} > trials {_whole(trials)}")
    budget.add(where, trials)
    return np.r_[np.ones(int(successes)), np.zeros(int(trials) - int(successes))]


class _TrialBudget:
    """Refuses a scores file whose prompts together claim more than :data:`MAX_TOTAL_TRIALS` runs, at the line that
    passes it (before its scores are made)."""

    def __init__(self):
        self.total = 0

    def add(self, where: str, runs: int) -> None:
        self.total += int(runs)
        if self.total > MAX_TOTAL_TRIALS:
            raise UserError(f"{where}: the prompts up to here claim {self.total:,} runs, more than {MAX_TOTAL_TRIALS:,} "
                            f"in one file")


def _jsonl_rows(path: Path, text: str) -> list[tuple[int, str, np.ndarray]]:
    rows = []
    budget = _TrialBudget()
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None  # or an int too long
        if not isinstance(record, dict):
            raise UserError(f"{where}: a JSON object per line, got {type(record).__name__}")
        uid = record.get("uid", record.get("id"))
        rewards = record.get("rewards", record.get("scores"))
        if rewards is not None:
            if not isinstance(rewards, list) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in rewards):
                raise UserError(f"{where}: rewards must be a list of finite numbers, got {json.dumps(rewards)}"[:300])
            scores = np.asarray(rewards, dtype=float)
            budget.add(where, scores.size)
            said = {"successes": (record.get("successes"), float(scores.sum())),
                    "trials": (record.get("trials", record.get("n_runs")), scores.size)}
            wrong = [f"{k} {json.dumps(v)}" for k, (v, fact) in said.items() if v is not None and v != fact]
            if wrong:  # counts given beside the rewards must be theirs
                raise UserError(f"{where}: {' and '.join(wrong)} disagree with its rewards ({scores.sum():g} of "
                                f"{scores.size} right); give one or the other")
        elif "successes" in record and ("trials" in record or "n_runs" in record):  # n_runs: an audit's samples.jsonl
            trials = record.get("trials", record.get("n_runs"))
            scores = _counts_scores(where, record["successes"], trials, budget)
        else:
            raise UserError(f"{where}: no 'rewards' (a list of 0/1 per run) and no 'successes' with 'trials'")
        rows.append((number, None if uid is None else str(uid), scores))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, str, np.ndarray]]:
    import csv

    reader = csv.DictReader(io.StringIO(text, newline=""))  # the csv module's own line ends (quoted ones kept)
    try:
        return _csv_counts(path, reader)
    except csv.Error as exc:  # a field past the csv module's size limit; line_num counts the lines read before
        raise UserError(f"{path}: line {reader.line_num + 1}: not readable as CSV ({exc})") from None


def _csv_counts(path: Path, reader) -> list[tuple[int, str, np.ndarray]]:
    columns = [c.strip() for c in reader.fieldnames or []]
    if "successes" not in columns or "trials" not in columns:
        raise UserError(f"{path}: the header must name successes and trials (and uid, optional); it has "
                        f"{', '.join(columns) or 'nothing'}")
    rows = []
    budget = _TrialBudget()
    number = reader.line_num  # the header's last line
    for row in reader:
        after, number = number, reader.line_num  # the line the row ends on: its only line, as none may break one
        fields = [v for v in row.values() if isinstance(v, str)] + [x for v in row.values() if isinstance(v, list)
                                                                    for x in v]
        breaks = sum(v.count("\n") + v.count("\r") - v.count("\r\n") for v in fields)
        if breaks:
            raise UserError(f"{path}: line {max(after + 1, number - breaks)}: a field runs over several lines (an "
                            f"unclosed quote?)")
        if None in row:  # csv puts the fields past the header's under None
            raise UserError(f"{path}: line {number}: more fields than the header's {len(columns)}")
        row = {(k or "").strip(): (v or "").strip() for k, v in row.items()}
        if not any(row.values()):
            continue
        where = f"{path}: line {number}"
        values = []
        for name in ("successes", "trials"):
            try:
                values.append(float(row[name]))
            except ValueError:
                raise UserError(f"{where}: {name} must be a whole number >= 0, got {row[name]!r:.40}") from None
        rows.append((number, row.get("uid") or None, _counts_scores(where, *values, budget)))
    return rows


def read_counts(source) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per prompt, successes and runs of an audit folder or a scores file (:func:`load_pool`), and warnings on
    what weakens them. Refuses (one line, :class:`UserError`) what is neither, graded rewards, fewer than
    :data:`MIN_RUNS` runs per prompt or fewer than :data:`MIN_PROMPTS` prompts."""
    pool = load_pool(source)
    if not pool.scores:
        raise UserError(f"{source}: the audit has no finished runs yet")
    graded = [(u, s) for u, s in zip(pool.uids, pool.scores) if not np.isin(s, (0.0, 1.0)).all()]
    if graded:
        uid, s = graded[0]
        bad = next(float(v) for v in s if v not in (0.0, 1.0))
        raise UserError(f"{source}: graded rewards ({len(graded)} prompts have scores other than 0 and 1, "
                        f"e.g. {bad:g} for {uid!r}); advise models pass/fail rewards")
    n = np.array([s.size for s in pool.scores])
    if n.max() < MIN_RUNS:
        raise UserError(f"{source}: {n.max()} run per prompt; a pass rate cannot be told from luck in one run: "
                        f"audit with --runs 8 ({MIN_RUNS} at the least)")
    k, n = gate_counts(np.array([int(s.sum()) for s in pool.scores]), n)  # prompts with MIN_RUNS or more runs
    dropped = len(pool.scores) - k.size
    if k.size < MIN_PROMPTS:
        raise UserError(f"{source}: {k.size} prompt{'' if k.size == 1 else 's'} with {MIN_RUNS} or more runs; advise "
                        f"needs at least {MIN_PROMPTS} to fit a distribution")
    warnings = []
    if dropped:
        warnings.append(f"{dropped} prompts with fewer than {MIN_RUNS} runs left out")
    warnings += pool.warnings
    if n.min() < 4:
        warnings.append(f"{n.min()} runs per prompt identify little of the distribution's shape; 8 or more are better")
    return k, n, warnings


def _check_signal(folder, k: np.ndarray, n: np.ndarray) -> None:
    """Refuse, before any fit or simulation, a pool whose every audited prompt was solved in all its runs or
    failed in all of them: no group has two different rewards, so there is nothing to advise on."""
    if (k == n).all() or (k == 0).all():
        solved = bool((k == n).all())
        raise UserError(f"{folder}: every one of the {k.size} audited prompts was {'solved' if solved else 'failed'} in "
                        f"all its runs: no group of any size has two different rewards, so GRPO learns nothing from this "
                        f"pool and curation has nothing to choose between; audit "
                        + ("harder prompts" if solved else "easier prompts or a stronger starting checkpoint (a warm "
                           "start, chapter 4), or raise --max-new-tokens if the runs were cut off"))


def _never_solved_warning(k: np.ndarray, out_of_reach: float) -> list[str]:
    """A warning where more than :data:`NEVER_SOLVED_WARN` of the audited prompts were never solved and the
    simulation has no floor (``out_of_reach`` 0)."""
    never = int((k == 0).sum())
    if never <= NEVER_SOLVED_WARN * k.size or out_of_reach:
        return []
    return [f"{never} of {k.size} prompts ({never / k.size:.0%}) were never solved in their runs: the simulated world "
            f"learns every prompt through shared skills, while a model may never solve some, so its predictions are "
            f"likely optimistic here (chapter 11); --out-of-reach SHARE or --out-of-reach-from LATER_AUDIT predicts "
            f"with a share of the pool never learnt"]


# ---------------------------------------------------------------------------------------------- the gate
def _bootstrap_fits(k, n, fit: BetaMixture, boots: int, rng: np.random.Generator) -> list[tuple[np.ndarray, BetaMixture]]:
    out = []
    for _ in range(boots):
        idx = rng.integers(0, k.size, k.size)
        out.append((idx, fit_beta_mixture(k[idx], n[idx], fit.k, start=fit)))
    return out


def gate_table(k, n, fit: BetaMixture, boots, sizes: Sequence[int] = GROUP_SIZES) -> list[dict[str, Any]]:
    """Per group size G: the share of zero-variance groups with a 95 % bootstrap interval, measured where
    every prompt has G or more runs and extrapolated by the fit beyond, and mixed groups per 1,000 rollouts."""
    rows = []
    for G in sizes:
        measured = G <= int(n.min())
        est = (lambda kk, nn, f: measured_zero_variance(kk, nn, G)) if measured else (lambda kk, nn, f: f.zero_variance(G))
        z = est(k, n, fit)
        zb = np.array([est(k[idx], n[idx], f) for idx, f in boots])
        lo, hi = np.quantile(zb, [0.025, 0.975])
        rows.append({"G": int(G), "zero_variance": float(z), "low": float(lo), "high": float(hi),
                     "measured": bool(measured), "mixed_per_1000": 1000.0 / G * (1 - z),
                     "mixed_per_1000_low": 1000.0 / G * (1 - hi), "mixed_per_1000_high": 1000.0 / G * (1 - lo)})
    return rows


def dense_waste(gate: list[dict[str, Any]], group_size: int, rho: float) -> dict[str, Any]:
    """What a trainer that trains every rollout of a kept group (verl's dense training, chapter 10) spends at
    the start on groups without signal. A step of uniform GRPO generates B G rollouts and trains them all, at
    cost B G (1 + rho); with z the share of zero-variance groups at G (``gate``'s row), z B G of the trained
    rollouts have a zero advantage, so the share of the step's cost that trains nothing is

        rho z / (1 + rho),

    with the 95 % interval of z's (measured where the audit has G runs or more, fitted beyond)."""
    row = next(r for r in gate if r["G"] == group_size)  # the gate covers every G advise takes (_check_options)
    f = rho / (1 + rho)
    return {"G": int(group_size), "rho": float(rho), "zero_variance": row["zero_variance"],
            "measured": row["measured"], "share": f * row["zero_variance"], "low": f * row["low"],
            "high": f * row["high"]}


# ---------------------------------------------------------------------------------------------- simulation
def _oracle_kwargs(oracle_every: int | None, oracle_runs: int) -> dict[str, Any]:
    """The oracles' options in the simulated world: exact pass rates every step, or an uncharged audit of
    ``oracle_runs`` sampled rollouts per prompt every ``oracle_every`` rollouts (in whole steps of 128)."""
    if oracle_every is None:
        return {}
    return {"refresh": max(1, round(oracle_every / SIM_TRAIN["rollouts_per_step"])), "runs": oracle_runs, "exact": False}


def _oracle_phrase(sim: dict[str, Any]) -> str:
    kw = sim.get("oracle") or {}
    if not kw:
        return "exact pass rates"
    every = kw["refresh"] * SIM_TRAIN["rollouts_per_step"]
    runs = f"{kw['runs']} run{'s' if kw['runs'] != 1 else ''}"
    return f"pass rates audited every {every:,} rollouts ({runs} a prompt, uncharged)"


def _sim_suite(group_size: int, oracle: dict[str, Any] | None = None) -> dict[str, Any]:
    arms = {"uniform": {"group_size": group_size}}
    arms.update({a: {**spec, "group_size": group_size} for a, spec in STRATEGY_ARMS.items()})
    for a in CEILING_ARMS:
        arms[a]["strategy_kwargs"] = dict(oracle or {})
    arms.update({f"uniform_g{g}": {"group_size": g} for g in SIM_GROUP_SIZES if g != group_size})
    return {"name": "advise", "_path": "rlcurate advise", "arms": arms}


def _sim_setup(pass_rates: np.ndarray, group_size: int, out_of_reach: float = 0.0) -> dict[str, Any]:
    world = {**SIM_WORLD, "n_prompts": len(pass_rates), "pass_rates": pass_rates, "out_of_reach": out_of_reach}
    return {"world": world, "budget": SIM_BUDGET,
            "train": {**SIM_TRAIN, "group_size": group_size, "prompts_per_step": SIM_TRAIN["rollouts_per_step"] // group_size}}


def _to_target(c: dict[str, np.ndarray], target: float, rho: float, training: str) -> tuple[float, float]:
    from rlcurate.comparison import rollouts_to_target

    spent = c["rollouts"] + rho * (c["kept"] if training == "dense" else c["mixed"])
    return rollouts_to_target(c["rollouts"], c["held_out"], target), rollouts_to_target(spent, c["held_out"], target)


def simulate(fit: BetaMixture, boots: Sequence[BetaMixture], group_size: int = 8, rho: float = 1.0,
             training: str = "dense", seeds: int = 4, lrs: Sequence[float] = SIM_LRS, pool: int | None = None,
             close_gap: float = SIM_CLOSE_GAP, oracle_every: int | None = None,
             oracle_runs: int = ORACLE_RUNS, out_of_reach: float = 0.0) -> dict[str, Any]:
    """The arms of :func:`_sim_suite` in the simulated world whose pool follows ``fit`` (seed s draws its
    600 pass rates from ``boots[s]``), each at its learning rate of least rollouts-to-target on one
    validation world drawn from ``fit``. The world holds :func:`sim_prompts` (``pool``) prompts, so that its
    training split is the pool's size up to 420 (a larger pool is simulated by 420 prompts). Per arm the paired ratio to uniform GRPO at ``group_size`` in
    rollouts and in cost (rollouts + ``rho`` x the rollouts trained: every rollout of a kept group when
    ``training`` is ``"dense"``, only those of mixed groups when ``"sparse"``). The oracles read exact pass
    rates every step, or with ``oracle_every`` an uncharged audit of ``oracle_runs`` rollouts per prompt every
    ``oracle_every`` rollouts (:func:`_oracle_kwargs`). ``out_of_reach``: the share of the world's prompts, those
    of lowest starting pass rate, that training never moves (:meth:`rlcurate.sim.world.SoftmaxWorld.make`)."""
    import logging

    quiet = logging.getLogger("rlcurate.curation")  # DAPO's "found 0 mixed groups" once a world is solved
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _simulate(fit, boots, group_size, rho, training, seeds, lrs, sim_prompts(pool), close_gap,
                         _oracle_kwargs(oracle_every, oracle_runs), out_of_reach)
    finally:
        quiet.setLevel(level)


def sim_prompts(pool: int | None) -> int:
    """Prompts of the simulated world for a training pool of ``pool``: its training split (70 %) is the
    pool, from 28 up to 420 (:data:`SIM_WORLD`'s 600)."""
    if pool is None:
        return SIM_WORLD["n_prompts"]
    return int(min(SIM_WORLD["n_prompts"], max(SIM_MIN_WORLD, math.ceil(pool / SIM_TRAIN_SHARE))))


def _simulate(fit, boots, group_size, rho, training, seeds, lrs, n_prompts, close_gap, oracle,
              out_of_reach) -> dict[str, Any]:
    from rlcurate.comparison import ratio_table
    from rlcurate.conditions import run_costs

    suite = _sim_suite(group_size, oracle)
    val_rates = fit.sample(n_prompts, np.random.default_rng(1000))
    lr = {}

    def unreached(**more) -> dict[str, Any]:  # uniform GRPO never reaches the target: no ratio to predict
        return {"unreached": True, "close_gap": close_gap, "out_of_reach": out_of_reach, "budget_cap": SIM_BUDGET,
                "world_prompts": n_prompts, "lr": lr, "seeds": seeds, **more}

    for arm, spec in sorted(suite["arms"].items(), key=lambda kv: kv[0] != "uniform"):  # uniform first
        setup = _sim_setup(val_rates, spec["group_size"], out_of_reach)
        scores = {}
        for r in lrs:
            c = run_costs(suite, setup, arm, 1000, float(r), "validation", close_gap=close_gap)
            scores[r] = _to_target(c, c["target"], rho, training)[0]
        lr[arm] = min(sorted(scores), key=lambda r: scores[r])  # ties go to the smaller rate
        if arm == "uniform" and not math.isfinite(scores[lr[arm]]):
            return unreached()
    rollouts: dict[str, dict[int, float]] = {a: {} for a in suite["arms"]}
    cost: dict[str, dict[int, float]] = {a: {} for a in suite["arms"]}
    skipping = training == "dense" and rho > 0
    skip: dict[int, float] = {}  # uniform GRPO's run, costed as if its zero-advantage groups were not trained
    for s in range(seeds):
        rates = boots[s % len(boots)].sample(n_prompts, np.random.default_rng(s))
        for arm, spec in suite["arms"].items():
            setup = _sim_setup(rates, spec["group_size"], out_of_reach)
            c = run_costs(suite, setup, arm, s, lr[arm], close_gap=close_gap)
            rollouts[arm][s], cost[arm][s] = _to_target(c, c["target"], rho, training)
            if skipping and arm == "uniform":
                skip[s] = _to_target(c, c["target"], rho, "sparse")[1]
    reached = sum(math.isfinite(v) for v in rollouts["uniform"].values())
    if reached == 0:  # every ratio would be the cap over the cap
        return unreached(uniform_reached=0)
    cap_cost = SIM_BUDGET * (1 + rho)
    tables = {"rollouts": ratio_table(rollouts, "uniform", budget=SIM_BUDGET, controls=[]),
              "cost": ratio_table(cost, "uniform", budget=cap_cost, controls=[])}
    if skipping:  # a zero advantage adds nothing to the update: the same runs, another bill (chapter 10)
        tables["skip_zero"] = ratio_table({"uniform": cost["uniform"], SKIP_ARM: skip}, "uniform", budget=cap_cost,
                                          controls=[])
        tables["cost_vs_skipping"] = ratio_table({SKIP_ARM: skip, **{a: cost[a] for a in SKIP_RIVALS}}, SKIP_ARM,
                                                 budget=cap_cost, controls=[])
    return {"arms": {a: s for a, s in suite["arms"].items()}, "lr": lr, "seeds": seeds, "close_gap": close_gap,
            "world_prompts": n_prompts, "oracle": oracle, "out_of_reach": out_of_reach, "uniform_reached": reached,
            "budget_cap": SIM_BUDGET, "currency": f"rollouts + {rho:g} x rollouts trained ({training})",
            "uniform_rollouts": {str(s): v for s, v in rollouts["uniform"].items()},
            "ratios": {cur: {a: {"ratio": r.ratio, "low": r.low, "high": r.high, "p_holm": r.p_holm}
                             for a, r in t.items()} for cur, t in tables.items()}}


# ---------------------------------------------------------------------------------------------- verdict
def _interval(r: dict[str, float]) -> str:
    return f"{r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"


def _holm(r: dict[str, float]) -> float:
    p = r.get("p_holm")
    return p if p is not None and math.isfinite(p) else 1.0


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _beyond_noise(r: dict[str, float], alpha: float = 0.05) -> int:
    """-1 (below 1) or +1 (above) where the interval excludes 1 and the Holm-adjusted p across the arms is
    below ``alpha`` (the intervals are per arm; a verdict over several arms needs the adjustment), else 0."""
    if _holm(r) >= alpha:
        return 0
    return -1 if r["high"] < 1 else 1 if r["low"] > 1 else 0


def _verdict(sim: dict[str, Any] | None, gate: list[dict[str, Any]], group_size: int,
             waste: dict[str, Any] | None = None) -> str:
    text = _sim_verdict(sim, gate, group_size)
    return f"{text}; {_dense_waste_verdict(waste, sim)}" if waste else text


def _gate_source(w: dict[str, Any]) -> str:
    return "measured" if w["measured"] else "fitted"


def _skipping_vs_rivals(sim: dict[str, Any]) -> str:
    vs = sim["ratios"]["cost_vs_skipping"]
    return ", ".join(f"{name} {_interval(vs[arm])} (Holm p {_p(_holm(vs[arm]))})" for arm, name in SKIP_RIVALS.items())


def _dense_waste_verdict(w: dict[str, Any], sim: dict[str, Any] | None) -> str:
    """The dense trainer's cheapest saving (chapter 10, *What a dense trainer should do at rho = 5*; chapter 11,
    rule 6): from the audit's gate, and predicted where the simulation ran."""
    text = (f"your trainer trains every rollout of a kept group: at the start {w['share']:.0%} "
            f"[{w['low']:.0%}, {w['high']:.0%}] of a step's cost trains groups whose advantage is zero "
            f"({_gate_source(w)}); skip them before changing the sampler")
    if "skip_zero" in (sim or {}).get("ratios", {}):
        r = sim["ratios"]["skip_zero"][SKIP_ARM]
        text += f" (predicted: {_interval(r)} of uniform's cost to the target; against that, {_skipping_vs_rivals(sim)})"
    return text


def _sim_verdict(sim: dict[str, Any] | None, gate: list[dict[str, Any]], group_size: int) -> str:
    if sim is not None and sim.get("unreached"):
        where = (f"in any of its {sim['seeds']} seeds (it did on the validation world)" if sim.get("uniform_reached") == 0
                 else "at any learning rate")
        head = (f"in the simulated world uniform GRPO at G = {group_size} does not close {sim['close_gap']:.0%} of the "
                f"held-out gap within {sim['budget_cap']:,} rollouts {where} from this pool")
        if sim.get("out_of_reach"):
            f, source = sim["out_of_reach"], sim.get("out_of_reach_from")
            return (f"{head} with {f:.0%} of it out of reach" + (f" ({source})" if source else "")
                    + f" (its pass rate cannot rise above about {1 - f:.2f}): no ratio to predict; ask for a smaller "
                    f"target with --close-gap")
        return (f"{head}: no ratio to predict; the pool is too hard for group-sampled RL as it stands (easier prompts, "
                f"a warm start, or hints, chapter 7), or ask for a smaller target with --close-gap")
    if sim is None:
        row = next(g for g in gate if g["G"] == group_size)
        return (f"at G = {group_size}, {row['zero_variance']:.0%} of groups would carry no signal "
                f"({row['low']:.0%}-{row['high']:.0%}); run without --no-sim for what curation could save")
    ro, co = sim["ratios"]["rollouts"], sim["ratios"]["cost"]
    best = min(CEILING_ARMS, key=lambda a: ro[a]["ratio"])
    ceiling = ro[best]
    shown = f"{best.replace('_', ' ')}: {_interval(ceiling)} of uniform's, Holm p {_p(_holm(ceiling))}"
    info = _oracle_phrase(sim)
    ceiling_name = "the ceiling with that audit" if sim.get("oracle") else "chapter 11's ceiling"
    if _beyond_noise(ceiling) == -1:
        parts = [f"with {info} an oracle saves about {1 - ceiling['ratio']:.0%} of the rollouts to the target in the "
                 f"simulated world of this pool ({shown}; {ceiling_name}: a benchmark, not a bound)"]
        if ceiling["high"] >= 0.9:
            parts[0] += ", little room"
    else:
        parts = [f"with {info} the saving is within the noise of {sim['seeds']} seeds here ({shown}; more "
                 f"--seeds narrow it)"]
    for arm, name in (("dapo", "DAPO"), ("greso", "GRESO's filter")):
        r = co[arm]
        word = {-1: "pays", 1: "spends more", 0: "is within the noise of uniform"}[_beyond_noise(r)]
        parts.append(f"{name} {word} in cost ({_interval(r)}, Holm p {_p(_holm(r))})")
    g_arms = {int(a.split("_g")[1]): ro[a] for a in ro if a.startswith("uniform_g")}
    better = {g: r for g, r in g_arms.items() if _beyond_noise(r) == -1}
    if better:
        g = min(better, key=lambda g: better[g]["ratio"])
        parts.append(f"G = {g} is faster in the simulation ({_interval(better[g])} of G = {group_size}'s rollouts, Holm "
                     f"p {_p(_holm(better[g]))}): a hypothesis for a paired run, not a measurement")
    else:
        parts.append(f"no other group size beats G = {group_size} beyond the noise (Holm-adjusted)")
    return "; ".join(parts)


def advise(audit_dir, group_size: int = 8, budget: int | None = None, rho: float = 1.0, training: str = "dense",
           pool: int | None = None, seeds: int | None = None, boots: int = 100, sim: bool = True,
           close_gap: float | None = None, seed: int = 0, oracle_every: int | None = None,
           oracle_runs: int = ORACLE_RUNS, out_of_reach: float | None = None, out_of_reach_from=None) -> Advice:
    """Read an audit folder and say what curation could buy on its pool (module docstring; chapter 11).
    ``out_of_reach_from``: an audit of a later checkpoint on the same prompts, whose never-solved share is
    taken as ``out_of_reach`` (:func:`never_solved_share`). Every option is checked before the audit is read.
    The simulation's own options (``seeds``, ``close_gap``, ``oracle_every``, ``out_of_reach`` and
    ``out_of_reach_from``; None: 4, :data:`SIM_CLOSE_GAP`, exact pass rates, 0, none) are said to be ignored
    where given with ``sim=False``, whatever their value; ``rho`` and ``training`` also set the gate's dense
    waste (:func:`dense_waste`), so they are read with or without the simulation."""
    sim_only = {"seeds": seeds, "close_gap": close_gap, "oracle_every": oracle_every, "out_of_reach": out_of_reach,
                "out_of_reach_from": out_of_reach_from}
    seeds = 4 if seeds is None else seeds
    close_gap = SIM_CLOSE_GAP if close_gap is None else close_gap
    out_of_reach = 0.0 if out_of_reach is None else out_of_reach
    _check_options(group_size, budget, rho, training, pool, seeds, boots, close_gap, oracle_every, oracle_runs,
                   out_of_reach)
    if out_of_reach_from is not None and out_of_reach:
        raise UserError("--out-of-reach-from: give it or --out-of-reach, not both")
    if out_of_reach_from is not None and Path(out_of_reach_from).resolve() == Path(audit_dir).resolve():
        raise UserError(f"--out-of-reach-from: {out_of_reach_from} is the audit being advised on; give an audit of a "
                        f"later checkpoint on the same prompts")
    k, n, warnings = read_counts(audit_dir)
    _check_signal(audit_dir, k, n)
    floor_note = None
    if out_of_reach_from is not None:
        out_of_reach, floor_note, floor_warnings = never_solved_share(audit_dir, out_of_reach_from)
        warnings += floor_warnings
    if not sim:
        given = ["--" + k.replace("_", "-") for k, v in sim_only.items() if v is not None]
        if given:
            warnings.append(f"ignored with --no-sim (they shape the simulation only): {', '.join(given)}")
    if pool is None and load_pool(audit_dir).limit is not None:
        warnings.append(f"the audit covers {k.size} prompts of its split (--limit): the simulation takes your training "
                        f"pool to be those {k.size}; give --pool-size, since the ratios depend on how often each "
                        f"prompt is revisited (chapter 11)")
    a = advise_counts(k, n, str(audit_dir), group_size, budget, rho, training, pool, seeds, boots, sim,
                      close_gap, seed, warnings, oracle_every, oracle_runs, out_of_reach)
    if floor_note and a.sim is not None:
        a.sim["out_of_reach_from"] = floor_note
        a.verdict = _verdict(a.sim, a.gate, group_size, a.dense_waste)  # an unreachable target names the floor's source
    return a


def never_solved_share(audit_dir, later_dir) -> tuple[float, str, list[str]]:
    """The share of ``audit_dir``'s prompts (those with :data:`MIN_RUNS` runs or more) that an audit of a later
    checkpoint, ``later_dir``, never solved, a line saying so, and warnings: roughly an upper bound on the floor
    of prompts the model never learns (a prompt of small pass rate may fail every run; chapter 11). Refuses, in
    one line, a later audit that is not one or shares fewer than :data:`MIN_PROMPTS` prompts with the first;
    warns where it covers under 90 % of them or its pass rate on them is not above the first's (swapped?)."""
    try:
        read_counts(later_dir)
    except UserError as exc:
        raise UserError(f"--out-of-reach-from: {exc}") from None
    start, later = load_pool(audit_dir), load_pool(later_dir)
    unnamed = [str(p) for p, pool in ((audit_dir, start), (later_dir, later)) if pool.numbered]
    solved = {u: bool(s.sum() > 0) for u, s in zip(later.uids, later.scores) if s.size >= MIN_RUNS}
    shared = [u for u, s in zip(start.uids, start.scores) if s.size >= MIN_RUNS and u in solved]
    if len(shared) < MIN_PROMPTS:
        raise UserError(f"--out-of-reach-from: {later_dir} shares {len(shared)} prompts with {audit_dir} (with "
                        f"{MIN_RUNS} or more runs in each); it must audit the same prompts, at least {MIN_PROMPTS}")
    never = sum(not solved[u] for u in shared)
    if never == len(shared):
        raise UserError(f"--out-of-reach-from: {later_dir} solved none of the {len(shared)} shared prompts: the "
                        f"model learnt nothing there, no floor to simulate")
    runs = int(np.median([s.size for s in later.scores]))
    first = sum(s.size >= MIN_RUNS for s in start.scores)
    in_shared = set(shared)

    def rate(audit) -> float:
        return float(np.mean([s.mean() for u, s in zip(audit.uids, audit.scores) if u in in_shared]))

    warnings = []
    if unnamed:
        warnings.append(f"--out-of-reach-from: {' and '.join(unnamed)} name{'s' if len(unnamed) == 1 else ''} prompts "
                        f"without ids: they are matched by their position, so both must list the same prompts in the "
                        f"same order")
    if len(shared) < 0.9 * first:
        warnings.append(f"--out-of-reach-from: {later_dir} audits {len(shared)} of the {first} prompts; the floor "
                        f"read from those is applied to the whole pool")
    if rate(later) <= rate(start):
        warnings.append(f"--out-of-reach-from: {later_dir} solves the shared prompts at {rate(later):.2f}, not above "
                        f"{audit_dir}'s {rate(start):.2f}: is it the later checkpoint's audit, and the other the start's?")
    return never / len(shared), (f"{never} of {len(shared)} prompts never solved in {runs} runs of a later "
                                 f"checkpoint, {later_dir}"), warnings


def advise_counts(successes, trials, source: str = "counts", group_size: int = 8, budget: int | None = None,
                  rho: float = 1.0, training: str = "dense", pool: int | None = None, seeds: int = 4,
                  boots: int = 100, sim: bool = True, close_gap: float = SIM_CLOSE_GAP, seed: int = 0,
                  warnings: Sequence[str] = (), oracle_every: int | None = None,
                  oracle_runs: int = ORACLE_RUNS, out_of_reach: float = 0.0) -> Advice:
    """:func:`advise` from per-prompt successes and runs (an audit of a simulated world, for instance)."""
    t0 = time.perf_counter()
    _check_options(group_size, budget, rho, training, pool, seeds, boots, close_gap, oracle_every, oracle_runs,
                   out_of_reach)
    k, n = np.asarray(successes, dtype=int), np.asarray(trials, dtype=int)
    fit = fit_beta_mixture(k, n)
    rng = np.random.default_rng(seed)
    boot = _bootstrap_fits(k, n, fit, boots, rng)
    gate = gate_table(k, n, fit, boot)
    means = np.array([np.mean(k[idx] / n[idx]) for idx, _ in boot])
    pass_rate = {"mean": float(np.mean(k / n)), "low": float(np.quantile(means, 0.025)),
                 "high": float(np.quantile(means, 0.975)), "mixed_in_audit": float(np.mean((k > 0) & (k < n)))}
    pool = int(pool or k.size)
    budget = int(budget or 100 * 128)
    warnings = [*warnings, *_never_solved_warning(k, out_of_reach if sim else 0.0)]
    if pool < k.size:
        warnings.append(f"--pool-size {pool:,} is smaller than the {k.size} prompts audited: the simulation takes your "
                        f"pool to be {pool:,} prompts drawn from the audited distribution")
    smallest = round(SIM_TRAIN_SHARE * SIM_MIN_WORLD)
    if sim and pool < smallest:
        warnings.append(f"a pool of {pool:,} prompts is simulated by {smallest} "
                        f"training prompts, the smallest world the simulation makes: each is revisited less often "
                        f"than yours")
    if sim and pool >= 1.5 * SIM_TRAIN_PROMPTS:  # revisited half as often again, or more
        warnings.append(f"a pool of {pool:,} prompts is simulated by {SIM_TRAIN_PROMPTS} training prompts, each "
                        f"revisited about {pool / SIM_TRAIN_PROMPTS:.1f} times as often as yours: the simulated "
                        f"ratios are for a smaller, more revisited pool")
    for row in gate:
        row["visits_per_prompt"] = budget / (row["G"] * pool)
        row["mixed_groups_in_budget"] = budget / row["G"] * (1 - row["zero_variance"])
    result = (simulate(fit, [f for _, f in boot], group_size, rho, training, seeds, pool=pool, close_gap=close_gap,
                       oracle_every=oracle_every, oracle_runs=oracle_runs, out_of_reach=out_of_reach) if sim else None)
    if result is not None:
        warnings += _simulation_warnings(result, oracle_every)
    waste = dense_waste(gate, group_size, rho) if training == "dense" and rho > 0 else None
    return Advice(audit=source, prompts=int(k.size), runs=int(n.max()), pass_rate=pass_rate, fit=fit,
                  gate=gate, budget=budget, pool=pool, group_size=group_size, rho=float(rho), training=training,
                  sim=result, verdict=_verdict(result, gate, group_size, waste), dense_waste=waste,
                  warnings=warnings, seconds=time.perf_counter() - t0, shares=k / n)


def _simulation_warnings(sim: dict[str, Any], oracle_every: int | None) -> list[str]:
    """Where the simulation's answer is weaker than its table looks: uniform GRPO censored at the cap in some
    seeds, an oracle audit cadence rounded away or past the budget."""
    out = []
    reached = sim.get("uniform_reached")
    if reached is not None and 0 < reached < sim["seeds"]:
        out.append(f"uniform GRPO reached the target in {reached} of {sim['seeds']} seeds within {SIM_BUDGET:,} rollouts; "
                   f"the others count as reaching it at that cap, so every ratio is censored and its interval too "
                   f"narrow: ask for a smaller target with --close-gap")
    step = SIM_TRAIN["rollouts_per_step"]
    if oracle_every is not None and oracle_every < step / 2:
        out.append(f"--oracle-every {oracle_every} is rollouts, not steps: it rounds to one step of {step} rollouts "
                   f"(an audit every 10 steps is --oracle-every {10 * step})")
    if oracle_every is not None and oracle_every >= SIM_BUDGET:
        out.append(f"--oracle-every {oracle_every:,} is past the simulation's {SIM_BUDGET:,} rollouts: the oracles read "
                   f"only the start's pass rates")
    return out


def _check_options(group_size, budget, rho, training, pool, seeds, boots, close_gap, oracle_every=None,
                   oracle_runs=ORACLE_RUNS, out_of_reach=0.0) -> None:
    if group_size not in SIM_GROUP_SIZES:
        raise UserError(f"--group-size: {group_size!r} is not one of {', '.join(map(str, SIM_GROUP_SIZES))} "
                        f"(the simulation's 128 rollouts per step split into whole groups)")
    for name, v, lo in (("--budget", budget, 1), ("--pool-size", pool, 1), ("--seeds", seeds, 2), ("--boots", boots, 20),
                        ("--oracle-every", oracle_every, 1), ("--oracle-runs", oracle_runs, 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise UserError(f"{name}: must be a whole number >= {lo}, got {v!r}")
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho < 0:
        raise UserError(f"--rho: must be a finite number >= 0 (training cost of a rollout over generating it), got {rho!r}")
    if isinstance(close_gap, bool) or not isinstance(close_gap, (int, float)) or not 0 < close_gap < 1:
        raise UserError(f"--close-gap: must lie in (0, 1) (the share of the held-out gap to 1 the target closes), got {close_gap!r}")
    if isinstance(out_of_reach, bool) or not isinstance(out_of_reach, (int, float)) or not 0 <= out_of_reach < 1:
        raise UserError(f"--out-of-reach: must lie in [0, 1) (the share of the pool the model never learns), got "
                        f"{out_of_reach!r}")
    if training not in ("dense", "sparse"):
        raise UserError(f"--training: must be dense or sparse, got {training!r}")


# ---------------------------------------------------------------------------------------------- output
def render(a: Advice) -> str:
    """The human summary."""
    f = a.fit
    lines = [f"{a.audit}: {a.prompts} prompts x {a.runs} runs, mean pass rate {a.pass_rate['mean']:.2f} "
             f"[{a.pass_rate['low']:.2f}, {a.pass_rate['high']:.2f}], {a.pass_rate['mixed_in_audit']:.0%} mixed in the audit",
             "pass-rate distribution (Beta mixture, BIC): " + ", ".join(
                 f"{w:.2f} x Beta({x:.3g}, {y:.3g})" for w, x, y in zip(f.w, f.a, f.b)),
             "",
             f"{'G':>4} {'zero-variance groups':>28} {'mixed per 1,000 rollouts':>26} {'visits/prompt':>14}"]
    for r in a.gate:
        how = "measured" if r["measured"] else "fitted"
        lines.append(f"{r['G']:>4} {r['zero_variance']:>7.0%} [{r['low']:.0%}, {r['high']:.0%}] {how:>9}"
                     f" {r['mixed_per_1000']:>12.0f} [{r['mixed_per_1000_low']:.0f}, {r['mixed_per_1000_high']:.0f}]"
                     f" {r['visits_per_prompt']:>11.2f}")
    lines.append(f"(visits per prompt at the budget of {a.budget:,} rollouts over {a.pool:,} prompts)")
    if a.predicted:
        s = a.sim
        lines += ["", f"PREDICTED in a simulated world with this pool ({s['seeds']} paired seeds, one bootstrap fit "
                      f"each): rollouts to close {s['close_gap']:.0%} of the held-out gap, over uniform GRPO at "
                      f"G = {a.group_size}; the oracles read {_oracle_phrase(s)}"
                      + (f"; {s['out_of_reach']:.0%} of the pool out of reach" if s.get("out_of_reach")
                         or s.get("out_of_reach_from") else "")
                      + (f" ({s['out_of_reach_from']})" if s.get("out_of_reach_from") else ""),
                  f"{'arm':<16}{'lr':>5}{'rollouts':>22}{'Holm p':>8}{'cost':>22}{'Holm p':>8}"]
        for arm in s["ratios"]["rollouts"]:
            ro, co = s["ratios"]["rollouts"][arm], s["ratios"]["cost"][arm]
            lines.append(f"{arm:<16}{s['lr'][arm]:>5g}{_interval(ro):>22}{_holm(ro):>8.3f}{_interval(co):>22}"
                         f"{_holm(co):>8.3f}")
        lines.append(f"cost = {s['currency']} (read it where training is a noticeable share of a step; rollouts "
                     f"where generation dominates); lr: the simulated world's learning rate per arm, tuned on its "
                     f"validation world, not a setting for your model; 95% intervals per arm, p-values "
                     f"Holm-adjusted across the arms within each currency: the verdict counts a difference only "
                     f"where both exclude noise")
    if a.dense_waste:
        w = a.dense_waste
        lines += ["", f"dense training (every rollout of a kept group trained, rho = {w['rho']:g}): at G = {w['G']}, "
                      f"z = {w['zero_variance']:.0%} of groups carry no signal at the start ({_gate_source(w)}), so "
                      f"rho z / (1 + rho) = {w['share']:.0%} [{w['low']:.0%}, {w['high']:.0%}] of a step's cost "
                      f"trains nothing"]
        if a.predicted and "skip_zero" in a.sim["ratios"]:
            r = a.sim["ratios"]["skip_zero"][SKIP_ARM]
            lines.append(f"PREDICTED: uniform GRPO that skips them reaches the target with {_interval(r)} of its cost; "
                         f"over that cost: {_skipping_vs_rivals(a.sim)}")
        lines.append(f"({SKIP_NOTE}; where a sampler beat uniform GRPO in dense cost, chapters 10 and 11, uniform GRPO "
                     f"that skipped them was indistinguishable from it; {SKIP_OPTIONS})")
    lines += ["", "verdict: " + a.verdict]
    lines += [f"warning: {w}" for w in a.warnings]
    if a.predicted:
        lines.append(f"caveat: {CAVEAT}")
    lines.append(f"({a.seconds:.1f} s)")
    return "\n".join(lines)


def plot(a: Advice, path) -> None:
    """The pool's pass rates (the audit's raw shares and the fitted density) and the gate at each G, measured
    and extrapolated."""
    import matplotlib

    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = np.linspace(0.002, 0.998, 400)
    if a.shares is not None:  # the audit's raw shares k / n, one bar per possible count
        bins = (np.arange(a.runs + 2) - 0.5) / a.runs  # one bar centred on each k / n
        ax1.hist(a.shares, bins=bins, density=True, color="0.8", label=f"raw shares in {a.runs} runs")
    ax1.plot(x, a.fit.pdf(x), color="black", label="fitted pass-rate density")
    ax1.set(xlabel="pass rate p", ylabel="density", title=f"{a.prompts} prompts x {a.runs} runs",
            ylim=(0, min(8.0, float(a.fit.pdf(x).max()) * 1.1)))
    ax1.legend(frameon=False)
    G = np.array([r["G"] for r in a.gate])
    z = np.array([r["zero_variance"] for r in a.gate])
    measured = np.array([r["measured"] for r in a.gate])
    ax2.fill_between(G, [r["low"] for r in a.gate], [r["high"] for r in a.gate], color="0.85", label="95% interval")
    ax2.plot(G[measured], z[measured], "o-", color="black", label="measured")
    ax2.plot(G[~measured], z[~measured], "o--", color="grey", mfc="white", label="fitted")
    ax2.set(xscale="log", xlabel="group size G", ylabel="zero-variance groups", ylim=(0, 1),
            title="the gate at each group size")
    ax2.set_xticks(G, [str(g) for g in G])
    ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from rlcurate._help import ArgumentParser, HelpFormatter

    ap = ArgumentParser(prog="rlcurate advise", formatter_class=HelpFormatter,
                        description="From an audit of your model on your prompts to a decision: the pool's "
                                    "pass-rate distribution, the gate at each group size, and what curation could "
                                    "save, predicted in the simulated world (chapters 4 and 11).")
    ap.add_argument("audit", help="an audit folder (rlcurate audit --out DIR), any backend, or a file of your own "
                                  "evaluation's pass/fail results: .jsonl, one prompt a line, {\"uid\": ..., "
                                  "\"rewards\": [1, 0, ...]} or {\"uid\": ..., \"successes\": k, \"trials\": n}; or "
                                  ".csv with columns uid, successes, trials")
    ap.add_argument("--group-size", type=int, default=8,
                    help=f"the group size G you train with: one of {', '.join(map(str, SIM_GROUP_SIZES))} (the "
                         f"simulation's 128 rollouts per step in whole groups)")
    ap.add_argument("--budget", type=int, default=None,
                    help="your rollout budget (default 12,800): it sets the gate table's visits per prompt and mixed "
                         "groups; the simulation runs to its target (--close-gap), whatever the budget")
    ap.add_argument("--pool-size", type=int, default=None,
                    help="prompts in your training pool (default: those audited); the simulated world holds at most "
                         f"{SIM_TRAIN_PROMPTS} training prompts")
    ap.add_argument("--rho", type=float, default=1.0,
                    help="cost of training on one rollout over generating it: `rlcurate train` prints it for your "
                         "setting at its end (bench/bench_rho.py: 2.79 for the tiny model on a CPU; for Qwen2.5-0.5B "
                         "appendix A1's nominal H100 ceilings give about 1.4 at 256 sequences and 2.4 at 1,024, and "
                         "measured GPU steps 0.36 with the eager decode to 2.25 with the captured one). Chapter 10 reads "
                         "samplers across it")
    ap.add_argument("--training", default="dense", metavar="{dense,sparse}",
                    help="dense: the trainer trains every rollout of a kept group (verl, TRL), and advise says what "
                         "training the groups without signal costs (rho z / (1 + rho) of a step at the start) and sets "
                         "uniform GRPO that skips them against DAPO and GRESO; sparse: only rollouts with a non-zero "
                         "advantage are trained (this package's trainer)")
    ap.add_argument("--seeds", type=int, default=None,
                    help="paired seeds of the simulation (default 4, what chapter 11's check of its predictions used: "
                         "under half a minute for a 432-prompt audit on a 2-core CPU, a minute with --oracle-every; "
                         "8 or 16 narrow the intervals and take longer)")
    ap.add_argument("--close-gap", type=float, default=None,
                    help=f"the simulation's target: the start's held-out pass rate plus this share of its gap to 1 "
                         f"(default {SIM_CLOSE_GAP:g})")
    ap.add_argument("--boots", type=int, default=100, help="bootstrap refits of the distribution")
    ap.add_argument("--oracle-every", type=int, default=None, metavar="ROLLOUTS",
                    help="the oracles read pass rates sampled by an uncharged audit of the pool every ROLLOUTS "
                         "rollouts (rounded to whole steps of 128, at least one) instead of exact ones every step: the "
                         "ceiling an oracle run on a language model can reach (chapter 11's oracles: 1,280)")
    ap.add_argument("--oracle-runs", type=int, default=None,
                    help=f"runs per prompt of that audit (with --oracle-every; default {ORACLE_RUNS})")
    ap.add_argument("--no-sim", action="store_true",
                    help="the fit and the gate only, no simulation (seconds: 2.5 s for 432 audited prompts); writes "
                         "advice_gate.json and advice_gate.png, leaving a full run's advice.json as it is")
    ap.add_argument("--out-of-reach", type=float, default=None, metavar="SHARE",
                    help="the share of the pool, in [0, 1), the model will never learn (the prompts of lowest pass "
                         "rate stay where they start in the simulated world; default 0, every prompt within reach). "
                         "The starting audit cannot tell it; the share an audit of a later checkpoint still never "
                         "solves bounds it from above, roughly (chapter 11)")
    ap.add_argument("--out-of-reach-from", default=None, metavar="LATER_AUDIT",
                    help="an audit of a later checkpoint (a short uniform run) on the same prompts: the share of "
                         "them it never solves is taken as --out-of-reach (roughly an upper bound on the floor)")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the summary")
    ap.add_argument("--out", default=None, help="folder for the advice's JSON and plot (default: the audit folder, or "
                                                "the scores file's folder)")
    args = ap.parse_args(argv)
    if args.oracle_runs is not None and args.oracle_every is None:
        raise UserError("--oracle-runs: only with --oracle-every (without it the oracles read exact pass rates)")
    if args.out is not None and not args.out.strip():
        raise UserError("--out: empty; give a folder for the advice (default: the audit folder)")
    source = Path(args.audit)
    out = Path(args.out) if args.out else (source.parent if source.suffix.lower() in SCORES_SUFFIXES else source)
    if args.out:  # before the simulation, so that its result has somewhere to go
        from rlcurate.train.preflight import check_out_dir

        try:
            check_out_dir(args.out)
        except UserError as exc:
            raise UserError(f"--out: {exc}") from None
    elif out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        where = "the audit folder" if out == source else "the scores file's folder"
        raise UserError(f"{out}: the advice is written into {where}, which this user cannot write; give --out FOLDER")
    a = advise(args.audit, args.group_size, args.budget, args.rho, args.training, args.pool_size, args.seeds,
               args.boots, not args.no_sim, args.close_gap, oracle_every=args.oracle_every,
               oracle_runs=ORACLE_RUNS if args.oracle_runs is None else args.oracle_runs,
               out_of_reach=args.out_of_reach, out_of_reach_from=args.out_of_reach_from)
    out.mkdir(parents=True, exist_ok=True)
    stem = "advice_gate" if args.no_sim else "advice"
    replaced = " (replacing the earlier ones)" if (out / f"{stem}.json").exists() else ""
    (out / f"{stem}.json").write_text(json.dumps(a.to_dict(), indent=1) + "\n")
    plot(a, out / f"{stem}.png")
    print(json.dumps(a.to_dict(), indent=1) if args.json
          else render(a) + f"\nwritten: {out / stem}.json, {stem}.png{replaced}")
    return 0
