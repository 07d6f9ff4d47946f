"""A prompt-selection strategy of :mod:`rlcurate.curation` driven by another trainer (appendices A1-A2).

rlcurate's own :class:`~rlcurate.train.Trainer` calls ``selector.select(ctx, k)`` before a step and
``curator.observe(ctx, groups)`` after it. TRL and verl call a torch ``Sampler`` instead and know
nothing of either; :class:`PromptSelection` is the adapter both samplers share. It

* builds the selector from a strategy name (``insight``, ``mopps``, ``expected_difficulty``,
  ``inverse_evidence``, ``prefilter``, ``uniform``) or takes a :class:`~rlcurate.curation.base.Selector`;
* chooses ``k`` prompts at a time with a step context seeded by (seed, selection round), so that
  every rank of a multi-process run that has observed the same rewards chooses the same prompts;
* turns rewards of (prompt index, reward) pairs into one :class:`~rlcurate.curation.base.Group` per
  prompt and hands them to the selector's ``observe`` exactly as the rlcurate trainer would;
* saves and restores all of that (``state_dict`` / ``load_state_dict``, JSON-friendly).

Only *prompt-level* strategies can be samplers. The response-level ones (Reinforce-Ada, SAGE, GVM,
DAPO's filter, DRO) decide how many completions to draw or how to weight them, which a sampler never
sees; they need hooks inside the trainer (appendix A2).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from rlcurate.curation.base import Curator, Group, Processor, Sampler, Selector, StepContext
from rlcurate.seeding import named_stream
from rlcurate.tasks.base import Problem

__all__ = ["PromptSelection", "resolve_selector", "problems_by_uid", "foreign_parts", "HostedRow",
           "check_task_hints", "PROMPT_LEVEL_STRATEGIES"]

PROMPT_LEVEL_STRATEGIES = ("insight", "mopps", "expected_difficulty", "inverse_evidence", "prefilter", "uniform")


def resolve_selector(strategy: str | Selector | Curator, **kwargs) -> Selector:
    """The :class:`Selector` of a prompt-level strategy (a name, a selector, or a curator whose sampler
    is the plain one and which has no processors). Raises ``ValueError`` for response-level strategies
    and for a prefilter without an audit file (a sampler cannot run rollouts to audit)."""
    from rlcurate.curation.prefilter import PrefilterSelector

    if isinstance(strategy, Selector):
        if kwargs:
            raise ValueError("keyword arguments are only used with a strategy name")
        selector = strategy
    else:
        curator = strategy
        if isinstance(strategy, str):
            from rlcurate.curation import build_curator

            curator = build_curator(strategy, **kwargs)
        elif kwargs:
            raise ValueError("keyword arguments are only used with a strategy name")
        if not isinstance(curator, Curator):
            raise ValueError(f"strategy must be a name, a Selector or a Curator, got {type(strategy).__name__}")
        extra = [p.name for p in curator.processors if type(p) is not Processor]
        if type(curator.sampler) is not Sampler or extra:
            parts = ([f"sampler {curator.sampler.name!r}"] if type(curator.sampler) is not Sampler else []) + \
                    [f"processor {n!r}" for n in extra]
            raise ValueError(
                f"strategy {curator.name!r} acts on responses ({', '.join(parts)}), not only on which prompts "
                f"are drawn; a sampler cannot run it. Prompt-level strategies: {', '.join(PROMPT_LEVEL_STRATEGIES)}. "
                "The response-level ones run around the trainer's generation where it can host them: in TRL "
                "rlcurate.interop.trl.CuratedGRPOTrainer(strategy=...), around verl 0.7's rollout manager "
                "rlcurate.interop.verl_rollout.CuratedRollout (appendix A2, 'Scaling out with verl').")
        selector = curator.selector
    if selector.needs_trainer:
        raise ValueError(f"strategy {selector.name!r} cannot run in another trainer's sampler: {selector.needs_trainer}. "
                         f"Prompt-level strategies that can: {', '.join(PROMPT_LEVEL_STRATEGIES)}")
    if isinstance(selector, PrefilterSelector):
        if selector.audit_file is None:
            raise ValueError("the prefilter as a sampler needs audit_file= (the mixed.jsonl of `rlcurate audit`): "
                             "a sampler cannot run the audit's rollouts itself")
        if selector.reaudit_every:
            raise ValueError("reaudit_every needs rollouts inside the trainer; use 0 with a sampler")
    return selector


def foreign_parts(curator: Curator, hosted: Sequence[type]) -> list[str] | None:
    """The names of a curator's response-level parts (its sampler and processors) that another trainer cannot
    host, given the classes it hosts; ``None`` when the curator has no response-level part at all (a
    prompt-level strategy). Classes are compared by name, so a module imported twice still matches."""
    parts = [curator.sampler, *curator.processors]
    if all(type(p) in (Sampler, Processor) for p in parts):
        return None
    names = {c.__name__ for c in hosted}
    return [p.name for p in parts if type(p) not in (Sampler, Processor) and type(p).__name__ not in names]


class HostedRow:
    """A completion another trainer generated, in its generation call ``call`` at row ``row``: what the groups of a
    strategy hosted around that trainer's generation hold (TRL's ``CuratedGRPOTrainer``, verl's ``CuratedRollout``).

    By default a row holds no tokens: ``token_ids`` is one placeholder, so that a processor that weights per token
    (Ada-Seq's class weights) gives one weight per completion. Where a strategy reads the tokens (DRO teacher-forces
    the reference answer after each completion's reasoning) it holds this package's
    :class:`~rlcurate.rollout.base.Completion` fields: the prompt and completion token ids (the EOS token included)
    and the text as this package decodes it."""

    __slots__ = ("call", "row", "token_ids", "prompt_token_ids", "text")

    def __init__(self, call: int, row: int, token_ids=(0,), prompt_token_ids=(), text: str = ""):
        self.call, self.row = call, row
        self.token_ids, self.prompt_token_ids, self.text = token_ids, prompt_token_ids, text

    def __repr__(self):
        return f"HostedRow({self.call}, {self.row})"


def check_task_hints(hints, task, who: str, *, chat_turns: bool) -> None:
    """Refuse (``ValueError`` naming ``who``) SAGE hints another trainer cannot write (chapter 7, appendix A2).

    Another trainer can only write the task's own hints (``task.hint``: the reference solution's first steps,
    SAGE's rule); hints the policy writes itself are generated by this package's trainer. Where the trainer
    renders the chat turns itself (``chat_turns``: verl's agent loop), the hint must go in the user turn;
    the rest of what the task can place is :meth:`~rlcurate.curation.sage_hints.HintSource.check_task`'s.
    """
    if hints.kind(task) != "task":
        name = getattr(task, "name", type(task).__name__)
        why = (f"task {name!r} has no hint() method, so hint_source 'auto' means hints the policy writes itself"
               if hints.source == "auto" else f"hint_source {hints.source!r} means hints the policy writes itself")
        raise ValueError(f"{who}: {why}, which need this package's trainer; with hint_source: task and hint_mode: "
                         "user the hints are the reference solution's steps (SAGE's rule)")
    if chat_turns and hints.render_mode not in (None, "user"):
        raise ValueError(f"{who}: hint_mode {hints.render_mode!r} writes into the assistant turn, which this "
                         "trainer's chat template writes itself; only 'user' (SAGE's own) is possible")
    try:
        hints.check_task(task)
    except ValueError as exc:
        raise ValueError(f"{who}: {exc}") from None


def problems_by_uid(task, uids: Sequence[str], where: str) -> list[Problem]:
    """The task's problem of each uid, looked up over its train, validation and test splits (SAGE's hints and
    DRO's reference answers in another trainer's dataset). Raises ``ValueError`` naming the first uid the task
    does not have; ``where`` says where the uids came from."""
    by_uid = {}
    for split in ("train", "validation", "test"):
        try:
            by_uid.update((p.uid, p) for p in task.problems(split))
        except (ValueError, KeyError):  # a task without this split
            continue
    missing = [u for u in uids if str(u) not in by_uid]
    if missing:
        raise ValueError(f"{where}: uid {missing[0]!r} ({len(missing)} of {len(uids)} missing) is not a problem of task "
                         f"{getattr(task, 'name', type(task).__name__)!r} (its splits hold {len(by_uid)} problems)")
    return [by_uid[str(u)] for u in uids]


class _Engine:
    """Stands in for a rollout engine: a sampler never generates."""

    def generate(self, *args, **kwargs):
        raise RuntimeError("this selector tried to generate rollouts; only prompt-level strategies work as "
                           "samplers (appendix A2)")


class PromptSelection:
    """A selector fed by another trainer: :meth:`select` k prompts, :meth:`observe` their rewards.

    Args:
        strategy: a strategy name, a :class:`Selector` or a prompt-level :class:`Curator`.
        n_items: size of the training pool (the dataset).
        group_size: completions per prompt (INSIGHT's K defaults to it).
        seed: seeds every selection round: round r uses the stream ``curator`` of round r (:mod:`rlcurate.seeding`),
            the generator rlcurate's trainer uses at step r.
        uids: one stable id per pool item (the prefilter matches an audit file's uids against them);
            default ``str(position)``.
        problems: the pool's problems, where a hosted strategy needs them (SAGE's hints); default placeholders
            holding only the uids.
        **kwargs: the strategy's keyword arguments (with a name only).
    """

    def __init__(self, strategy, n_items: int, group_size: int = 8, seed: int = 0,
                 uids: Sequence[str] | None = None, problems: Sequence[Problem] | None = None, **kwargs):
        if isinstance(n_items, bool) or int(n_items) < 1:
            raise ValueError(f"n_items must be a positive integer, got {n_items!r}")
        self.n_items = int(n_items)
        self.group_size = int(group_size)
        self.seed = int(seed)
        uids = [str(i) for i in range(self.n_items)] if uids is None else [str(u) for u in uids]
        if len(uids) != self.n_items:
            raise ValueError(f"uids holds {len(uids)} ids for a pool of {self.n_items}")
        if problems is not None and len(problems) != self.n_items:
            raise ValueError(f"problems holds {len(problems)} problems for a pool of {self.n_items}")
        self.problems = list(problems) if problems is not None else [Problem(uid=u, question="", answer="") for u in uids]
        self.selector = resolve_selector(strategy, **kwargs)
        self.selector.bind(self.n_items, self.seed)
        self.rounds = 0  # selections made
        self.observed = 0  # reward batches observed
        self.more_calls = 0  # calls to more()
        self.history: list[dict[str, Any]] = []  # per selection: round, observed batches, indices

    # ------------------------------------------------------------------ the two calls
    def context(self, step: int, k: int, rng=None) -> StepContext:
        return StepContext(step=step, seed=self.seed, problems=self.problems, task=None, engine=_Engine(),
                           group_size=self.group_size, prompts_per_step=k, rng=rng)

    def select(self, k: int) -> list[int]:
        """The next ``k`` prompts (pool positions) by the strategy, given every reward observed so far."""
        ctx = self.context(self.rounds, k)
        ctx._more_prompts = functools.partial(self.selector.more, ctx)
        chosen = [int(i) for i in self.selector.select(ctx, int(k))]
        self.history.append({"round": self.rounds, "observed": self.observed, "indices": chosen})
        self.rounds += 1
        return chosen

    def more(self, k: int, taken: Sequence[int] | None = None) -> list[int]:
        """``k`` more prompts for the step now running, by the selector's rule (:meth:`Selector.more`: DAPO's
        top-ups choose as this package's step does); ``taken``: the step's prompts so far (the selector's
        :meth:`Selector.take`), given when its generation batch was selected ahead of the step."""
        if taken is not None:
            self.selector.take(taken)
        # a stream of its own per call: the stream ``curator`` of round ``rounds`` is the next select()'s
        ctx = self.context(self.rounds, int(k), named_stream("prompt-selection-more", self.seed, self.rounds,
                                                             self.more_calls))
        self.more_calls += 1
        return [int(i) for i in self.selector.more(ctx, int(k))]

    def observe(self, indices: Sequence[int], rewards: Sequence[float],
                hint_levels: Sequence[int] | None = None, pool_successes: Sequence[float] | None = None,
                pool_sizes: Sequence[int] | None = None, trained: Sequence[Group] | None = None,
                trained_rows: Sequence[bool] | None = None) -> dict[int, tuple[int, int]]:
        """Feed back one batch of scored completions: ``indices[j]`` is the pool position of completion
        j's prompt, ``rewards[j]`` its reward (NaN: unscored, ignored), ``hint_levels[j]`` the hint level its
        prompt carried (SAGE, chapter 7; default 0: the selector's own rule decides what a hinted group
        says). The completions of a prompt at one hint level form one group, in the given order.

        ``pool_successes[j]`` and ``pool_sizes[j]`` (size 0: none) are the unhinted rollouts generated for
        completion j's prompt this step when the batch holds only some of them (:class:`Group`'s fields of the
        same names: Reinforce-Ada's whole pool, SAGE's level-0 group of a rescued prompt, as
        :mod:`rlcurate.interop.verl_rollout` writes them). A group with them is observed as this package's
        trainer observes it: its evidence is the pool's, and the generated groups (``evidence="generated"``)
        hold the pool, as an unhinted group, in place of the group's own rows, plus the group itself when it is
        hinted. ``trained``: the groups the step trained, when they are not all the batch's groups (a host that
        runs a strategy's sampler and processors, with their pool statistics); the selector's ``evidence="trained"``
        reads them, ``"generated"`` every row given. ``trained_rows[j]``: whether completion j was trained (the
        trained groups are then the trained rows', by prompt and hint level), for a host that knows it per row
        (verl's filters). Returns ``{prompt: (successes, trials)}`` of the unhinted
        evidence at the selector's success threshold (for logs and tests)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        r = np.asarray(rewards, dtype=float).reshape(-1)
        lv = np.zeros(idx.shape, dtype=np.int64) if hint_levels is None else np.asarray(hint_levels, np.int64).reshape(-1)
        if idx.shape != r.shape or lv.shape != idx.shape:
            raise ValueError(f"{idx.size} indices for {r.size} rewards and {lv.size} hint levels")
        if (pool_successes is None) != (pool_sizes is None):
            raise ValueError("pool_successes and pool_sizes go together")
        if trained is not None and trained_rows is not None:
            raise ValueError("give trained or trained_rows, not both")
        tr = np.ones(idx.shape, bool) if trained_rows is None else np.asarray(trained_rows, bool).reshape(-1)
        if tr.shape != idx.shape:
            raise ValueError(f"{idx.size} indices for {tr.size} trained_rows")
        ps = np.zeros(idx.shape) if pool_successes is None else np.asarray(pool_successes, dtype=float).reshape(-1)
        pn = np.zeros(idx.shape, np.int64) if pool_sizes is None else np.asarray(pool_sizes, np.int64).reshape(-1)
        if ps.shape != idx.shape or pn.shape != idx.shape:
            raise ValueError(f"{idx.size} indices for {ps.size} pool successes and {pn.size} pool sizes")
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_items):
            raise ValueError(f"prompt indices must lie in [0, {self.n_items}), got {int(idx.min())}..{int(idx.max())}")
        keep = ~np.isnan(r)
        idx, r, lv, ps, pn, tr = idx[keep], r[keep], lv[keep], ps[keep], pn[keep], tr[keep]
        threshold = float(getattr(self.selector, "success_threshold", 1.0))
        groups, generated, trained_groups, counts = [], [], [], {}

        def count(i, successes, trials):
            s0, n0 = counts.get(i, (0, 0))
            counts[i] = (s0 + int(successes), n0 + int(trials))

        def group_of(i, level, rewards):
            return Group(index=int(i), problem=self.problems[i], prompt="", completions=[None] * rewards.size,
                         rewards=rewards, generated=int(rewards.size), hint_level=int(level))

        for i, level in dict.fromkeys(zip(idx.tolist(), lv.tolist())):
            at = (idx == i) & (lv == level)
            ri = r[at]
            group = group_of(i, level, ri)
            groups.append(group)
            kept = at & tr  # the group's trained rows (all of them unless trained_rows says otherwise)
            if kept.any():
                trained_groups.append(group if kept.sum() == ri.size else group_of(i, level, r[kept]))
            size = int(pn[at][0])
            if size > 0:
                group.pool_successes, group.pool_size = float(ps[at][0]), size
                successes = int(round(group.pool_successes))
                generated.append(group_of(i, 0, np.r_[np.ones(successes), np.zeros(size - successes)]))
                count(int(i), successes, size)
                if level > 0:
                    generated.append(group)
            else:
                generated.append(group)
                if level == 0:
                    count(int(i), np.sum(ri >= threshold), ri.size)
        if trained_rows is not None:
            trained = trained_groups
        ctx = self.context(self.observed, max(len(groups), 1))
        ctx.generated_groups = generated
        self.selector.observe(ctx, groups if trained is None else list(trained))
        self.observed += 1
        return counts

    def metrics(self) -> dict[str, float]:
        """The selector's diagnostics plus the belief summary when it has beliefs."""
        out = {k: float(v) for k, v in self.selector.metrics().items()}
        beliefs = getattr(self.selector, "beliefs", None)
        if beliefs is not None:
            seen = beliefs.evidence > beliefs.alpha0 + beliefs.beta0
            out["prompts_observed"] = float(seen.sum())
            out["belief_mean_observed"] = float(beliefs.mean[seen].mean()) if seen.any() else float("nan")
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"selector": self.selector.state_dict(), "rounds": self.rounds, "observed": self.observed,
                "more_calls": self.more_calls, "n_items": self.n_items, "seed": self.seed, "group_size": self.group_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["n_items"]) != self.n_items:
            raise ValueError(f"state is for a pool of {state['n_items']} items, this one has {self.n_items}")
        self.selector.load_state_dict(state["selector"])
        self.rounds, self.observed = int(state["rounds"]), int(state["observed"])
        self.more_calls = int(state.get("more_calls", 0))  # absent from states saved before 2026-11-28
        self.seed, self.group_size = int(state["seed"]), int(state["group_size"])
