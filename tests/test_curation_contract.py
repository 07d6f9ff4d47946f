"""The strategy contract a researcher runs on a strategy of their own (``rlcurate.contract``,
``rlcurate strategies NAME --check``), and strategies kept outside the package (``RLCURATE_STRATEGIES``)."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlcurate.curation as package
from rlcurate.cli import main
from rlcurate.curation import available, build_curator, registry
from rlcurate.contract import check_strategy
from rlcurate.errors import UserError

README = Path(package.__file__).with_name("README.md")
LM_ONLY = {"dro"}  # needs the language model's log-probabilities: checked by tests/test_curation_dro.py
SIM_KWARGS = {"dro_filter": {"signal": "reward"}}  # its reference signal needs the language model


def readme_block(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


@pytest.fixture
def own_strategies(tmp_path, monkeypatch):
    """Write strategy files outside the package and name them in RLCURATE_STRATEGIES; the registry and
    ``sys.modules`` are restored afterwards."""
    available()
    saved = dict(registry._REGISTRY), set(registry._IMPORTED)
    written = []

    def write(name: str, code: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(code))
        written.append(path)
        monkeypatch.setenv(registry.PLUGINS_ENV, ":".join(map(str, written)))
        return path

    try:
        yield write
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved[0])
        registry._IMPORTED.clear()
        registry._IMPORTED.update(saved[1])
        registry._SILENT_PLUGINS.clear()
        for path in written:
            sys.modules.pop(f"rlcurate_strategies.{path.stem}", None)


@pytest.mark.parametrize("name", [n for n in available() if n not in LM_ONLY])
def test_every_strategy_here_keeps_the_contract(name):
    report = check_strategy(name, steps=8, compositions=False, numpy_alone=False, **SIM_KWARGS.get(name, {}))
    assert report["checks"] == ["described", "trains", "deterministic", "resumes exactly", "A/A control"]


def test_the_readme_example_in_a_file_of_ones_own_keeps_the_whole_contract(own_strategies, capsys):
    own_strategies("skip_solved", readme_block("## A worked example: `skip_solved.py`"))
    assert "skip_solved" in available()
    assert main(["strategies", "skip_solved", "--check"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("skip_solved: keeps the contract (described, trains, deterministic, resumes exactly, "
                           "A/A control, composes, numpy alone; composed ") and "not in the simulated world: dro" in line
    report = check_strategy("skip_solved", k=3)
    assert "skip_solved+dapo" in report["composed"] and "insight+skip_solved" in report["composed"]
    # the README's other two blocks run as written
    namespace: dict = {}
    exec(readme_block("## Testing it"), namespace)
    namespace["test_skip_solved_keeps_the_contract"]()
    exec(readme_block("## Running it in the simulated world"), {})
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out] == ["uniform", "skip_solved", "skip_solved+dapo"]


def test_the_readme_example_is_seen_solved_through_dapos_filter(own_strategies):
    """DAPO drops all-right groups before training: the example learns from ``ctx.generated_groups``, so
    it still skips solved prompts when composed with DAPO (as it would not from the trained groups)."""
    from rlcurate.sim import SoftmaxWorld
    from rlcurate.sim.bridge import SimTrainer

    own_strategies("skip_solved", readme_block("## A worked example: `skip_solved.py`"))
    world = SoftmaxWorld.make(n_prompts=40, pass_rates=[0.995] * 20 + [0.3] * 20, seed=0)
    skipped = {}
    for spec in ("skip_solved", "skip_solved+dapo"):
        run = SimTrainer(world, build_curator(spec), prompts_per_step=8, group_size=4, seed=0).run(16)
        skipped[spec] = sum(r["curation/skip_solved_skipped"] for r in run.records[1:])
    assert skipped["skip_solved"] >= 8 and skipped["skip_solved+dapo"] >= 8, skipped


BROKEN = {
    "global state": ("""
        import numpy as np
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator, Sampler, Selector
        from rlcurate.curation.registry import StrategyConfig, register

        class GlobalSelector(Selector):
            def select(self, ctx, k):
                return [int(i) for i in np.random.choice(self.n_items, size=k, replace=False)]

        @register("broken_global")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"Draws from numpy's global generator.\"\"\"

            def build(self):
                return Curator(GlobalSelector(), Sampler(), name=self.name)
        """, "two runs with the same seed differ"),
    "state": ("""
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator, Sampler, Selector
        from rlcurate.curation.registry import StrategyConfig, register

        class Forgetful(Selector):
            def __init__(self):
                super().__init__()
                self.seen = set()

            def select(self, ctx, k):
                fresh = [i for i in range(self.n_items) if i not in self.seen][:k]
                return fresh if len(fresh) == k else list(range(k))

            def observe(self, ctx, groups):
                self.seen.update(g.index for g in groups)

        @register("broken_state")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"Learns across steps but keeps nothing in state_dict.\"\"\"

            def build(self):
                return Curator(Forgetful(), Sampler(), name=self.name)
        """, "a run resumed from its state_dict at step 4 differs"),
    "json state": ("""
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator, Sampler, Selector
        from rlcurate.curation.registry import StrategyConfig, register

        class IntKeyed(Selector):
            def __init__(self):
                super().__init__()
                self.visits = {}

            def select(self, ctx, k):
                order = sorted(range(self.n_items), key=lambda i: (self.visits.get(i, 0), i))[:k]
                return [int(order[j]) for j in range(k)]

            def observe(self, ctx, groups):
                for g in groups:
                    self.visits[g.index] = self.visits.get(g.index, 0) + 1

            def state_dict(self):
                return {**super().state_dict(), "visits": self.visits}

            def load_state_dict(self, state):
                import numpy as np

                super().load_state_dict(state)
                counts = np.zeros(self.n_items, dtype=int)
                for i, c in state["visits"].items():
                    counts[i] = c  # a string key from JSON: IndexError
                self.visits = {int(i): int(c) for i, c in enumerate(counts) if c}

        @register("broken_json")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"Keeps an int-keyed map as its state: JSON gives it back with string keys.\"\"\"

            def build(self):
                return Curator(IntKeyed(), Sampler(), name=self.name)
        """, r"state_dict\['visits'\]\[0\] does not come back the same from JSON .*store int-keyed maps as rows"),
    "uncharged": ("""
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator, Sampler, Selector
        from rlcurate.curation.registry import StrategyConfig, register

        class Peeking(Sampler):
            def rollout(self, ctx, indices):
                # a search the step never pays for: sampled from the policy around ctx.generate
                ctx._policy.generate([ctx.render(i) for i in indices], 4, ctx._sampling, 0)
                return ctx.generate(indices, ctx.group_size)

        @register("broken_uncharged")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"Samples rollouts around ctx.generate.\"\"\"

            def build(self):
                return Curator(Selector(), Peeking(), name=self.name)
        """, r"the policy sampled 512 tokens, the step's counters charged 256: draw rollouts with ctx.generate"),
    "torch": ("""
        import torch
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator
        from rlcurate.curation.registry import StrategyConfig, register

        @register("broken_torch")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"Imports torch at import time.\"\"\"

            def build(self):
                return Curator(name=self.name)
        """, "building it needs more than numpy"),
    "undocumented": ("""
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator
        from rlcurate.curation.registry import StrategyConfig, register

        @register("broken_doc")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"An option without a docstring.\"\"\"

            k: int = 2

            def build(self):
                return Curator(name=self.name)
        """, r"options without a docstring right below them: \['k'\]"),
}


@pytest.mark.parametrize("fault", BROKEN)
def test_the_contract_names_what_a_broken_strategy_breaks(own_strategies, fault):
    code, message = BROKEN[fault]
    own_strategies(f"broken_{fault.split()[0]}", code)
    name = re.search(r'@register\("(\w+)"\)', code).group(1)
    with pytest.raises(AssertionError, match=message):
        check_strategy(name, steps=8, compositions=False)


def test_a_bad_entry_in_rlcurate_strategies_is_refused_in_one_line(own_strategies, monkeypatch, tmp_path):
    for entry, message in ((str(tmp_path / "missing.py"), "missing.py: no such file"),
                           ("no_such_module.sub", "'no_such_module.sub' is neither a .py file nor an importable module")):
        monkeypatch.setenv(registry.PLUGINS_ENV, entry)
        with pytest.raises(UserError, match=re.escape(message)):
            available()
    broken = own_strategies("typo", "x = 1\ny = undefined_name\n")
    with pytest.raises(UserError, match=re.escape(f"{broken}, line 2: importing it failed: NameError: name "
                                                  "'undefined_name' is not defined")):
        available()
    monkeypatch.delenv(registry.PLUGINS_ENV)
    with pytest.raises(UserError, match=r"a strategy in a file of your own: RLCURATE_STRATEGIES=path/to/it.py"):
        build_curator("my_own_strategy")


def test_a_file_that_registers_nothing_is_named_and_one_imported_twice_is_one_strategy(own_strategies, monkeypatch):
    """A strategy file without @register: the unknown name's message names the file. The same file imported through
    RLCURATE_STRATEGIES and by its module name (a notebook does both) registers one strategy, not two."""
    quiet = own_strategies("noreg", "from dataclasses import dataclass\nx = 1\n")
    with pytest.raises(UserError, match=re.escape(f"imported {quiet}, which registered no strategy (is @register")):
        build_curator("noreg")
    mine = own_strategies("skip_solved", readme_block("## A worked example: `skip_solved.py`"))
    assert "skip_solved" in available()
    monkeypatch.syspath_prepend(str(mine.parent))
    import importlib

    try:
        importlib.import_module("skip_solved")  # the same file under another module name: no "registered twice"
        assert build_curator("skip_solved").name
    finally:
        sys.modules.pop("skip_solved", None)


def test_an_installed_packages_entry_point_registers_its_strategy(own_strategies, monkeypatch, tmp_path):
    """A package declaring ``[project.entry-points."rlcurate.strategies"]`` is imported at the first lookup of
    a process (once: reading every package's metadata takes milliseconds)."""
    import importlib.metadata

    (tmp_path / "pkg_strategies.py").write_text(readme_block("## A worked example: `skip_solved.py`"))
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []

    def entry_points(group):
        calls.append(group)
        return [importlib.metadata.EntryPoint("skip_solved", "pkg_strategies", group)] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry._IMPORTED.discard(registry.ENTRY_POINT_GROUP)
    try:
        assert "skip_solved" in available() and "skip_solved" in available()
        assert calls == [registry.ENTRY_POINT_GROUP]
    finally:
        sys.modules.pop("pkg_strategies", None)


def test_a_first_choice_order_offset_does_not_change_is_noted(own_strategies, capsys):
    """A generator seeded with a constant looks from outside like a fixed rule: the check keeps it, with a note
    (an A/A control of it would repeat the run); ``--options`` passes the strategy's options."""
    own_strategies("constant_seed", """
        import numpy as np
        from dataclasses import dataclass
        from rlcurate.curation.base import Curator, Sampler, Selector
        from rlcurate.curation.registry import StrategyConfig, register

        class Constant(Selector):
            def __init__(self, seed):
                super().__init__()
                self.constant = seed

            def select(self, ctx, k):
                rng = np.random.default_rng([self.constant, ctx.step])
                return [int(i) for i in rng.choice(self.n_items, size=k, replace=False)]

        @register("constant_seed")
        @dataclass
        class Config(StrategyConfig):
            \"\"\"Draws from a generator seeded with a constant.\"\"\"

            seed: int = 0
            \"\"\"The constant.\"\"\"

            def build(self):
                return Curator(Constant(self.seed), Sampler(), name=self.name)
        """)
    assert main(["strategies", "constant_seed", "--check", "--options", "{seed: 3}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("constant_seed: keeps the contract")
    assert out[1].startswith("  note: its first choice does not change with order_offset")
    assert not check_strategy("uniform", steps=4, compositions=False, numpy_alone=False)["notes"]
    assert main(["strategies", "constant_seed", "--check", "--options", "{sed: 3}"]) == 2
    assert "strategy 'constant_seed' does not take sed (did you mean 'seed'?)" in capsys.readouterr().err


def test_a_parts_mistake_is_named_where_it_is_made():
    """Mistakes a strategy's author makes are named at the hook that made them: a selector returning floats or an
    index outside the pool, a sampler returning something other than Groups, and an observe that changes the
    rewards or another field of a group (which would otherwise be logged and learnt from as if scored; the metrics are
    taken before observe), a fact of the step assigned (``ctx.group_size = 2``) and a practical strategy reading the
    oracle's free pass rates."""
    from rlcurate.curation.base import Curator, Processor, Sampler, Selector, StrategyError
    from rlcurate.sim.bridge import SimTrainer
    from rlcurate.sim.world import SoftmaxWorld

    class Floats(Selector):
        name = "floats"

        def select(self, ctx, k):
            return [float(i) for i in range(k)]

    class Outside(Selector):
        name = "outside"

        def select(self, ctx, k):
            return [10_000] * k

    class Lists(Sampler):
        name = "lists"

        def rollout(self, ctx, indices):
            return [[g] for g in ctx.generate(indices, ctx.group_size)]

    class Zeroes(Selector):
        name = "zeroes"

        def observe(self, ctx, groups):
            for g in groups:
                g.rewards *= 0

    class Behind(Selector):  # more() is DAPO's refill: its indices are checked as select's
        name = "behind"

        def more(self, ctx, k):
            return [-1] * k

    class Dropper(Processor):  # a refill of every step: DAPO keeps only mixed groups and asks for more
        name = "dropper"

        def process(self, ctx, groups):
            ctx.more_prompts(1)
            return groups

    class NoReturn(Processor):
        name = "no_return"

        def process(self, ctx, groups):
            groups.sort(key=lambda g: g.size)  # sorted in place, and nothing returned

    class Inverse(Processor):
        name = "inverse"

        def process(self, ctx, groups):
            for g in groups:
                g.weight = 1 / g.rewards.mean() if g.rewards.mean() else float("inf")  # all wrong: infinite
            return groups

    class IntKeys(Selector):  # its state comes back from a checkpoint with string keys
        name = "int_keys"

        def state_dict(self):
            return {**super().state_dict(), "seen": {3: 1}}

    class Arrays(Selector):  # an array: the first checkpoint, after its steps, would fail
        name = "arrays"

        def state_dict(self):
            return {"order": np.arange(3)}

    class Wraps(Sampler):  # a negative index wrapped to the end of the pool; a float was truncated
        name = "wraps"

        def rollout(self, ctx, indices):
            return ctx.generate([-1 for _ in indices], ctx.group_size)

    class Regenerates(Processor):
        name = "regenerates"

        def process(self, ctx, groups):
            return groups + ctx.generate([g.index for g in groups], 2)

    class Listed(Selector):
        name = "listed"

        def metrics(self):
            return [1.0]

    class Empty(Selector):
        name = "empty"

        def select(self, ctx, k):
            return []

    class Halves(Sampler):  # a fact of the step rewritten: every later group would be half as large
        name = "halves"

        def rollout(self, ctx, indices):
            ctx.group_size = 2
            return ctx.generate(indices, ctx.group_size)

    class Peeks(Selector):  # a practical strategy reading the free pass rates of the ceiling arms
        name = "peeks"

        def select(self, ctx, k):
            p = ctx.oracle_pass_rates(range(len(ctx.problems)))
            return [int(i) for i in np.argsort(-p * (1 - p))[:k]]

    class Reweights(Processor):  # observe writing a field the trained step has already read
        name = "reweights"

        def observe(self, ctx, groups):
            groups[0].weight = 2.0

    world = SoftmaxWorld.make(n_prompts=40, seed=0)
    for curator, needle in ((Curator(Empty()), "selector 'empty': select returned no prompts"),
                            (Curator(sampler=Halves()), "ctx.group_size is a fact of the step, read-only"),
                            (Curator(Peeks()), "ctx.oracle_pass_rates is for the ceiling arms of chapter 11 alone: "
                                               "a part that reads it declares uses_oracle = True"),
                            (Curator(processors=[Reweights()]), "observe changed the weight of the group of prompt"),
                            (Curator(sampler=Wraps()), "ctx.generate: index -1 is outside the pool of"),
                            (Curator(processors=[Regenerates()]), "processor 'regenerates': process called "
                                                                  "ctx.generate; a processor keeps, drops or reweights"),
                            (Curator(Listed()), r"Listed 'listed': metrics must return a dict of numbers, got \[1.0\]"),
                            (Curator(Floats()), "selector 'floats': select must return pool indices"),
                            (Curator(Outside()), "returned index 10000, outside the pool of"),
                            (Curator(sampler=Lists()), "sampler 'lists': rollout must return a list"),
                            (Curator(Zeroes()), "observe changed the rewards"),
                            (Curator(Behind(), processors=[Dropper()]), "selector 'behind': more returned index -1"),
                            (Curator(processors=[NoReturn()]), "processor 'no_return': process must return a list"),
                            (Curator(processors=[Inverse()]), "processor 'inverse': the group of prompt .* has weight "
                                                              "inf; a group's weight must be finite"),
                            (Curator(IntKeys()), r"IntKeys 'int_keys': state_dict\['seen'\]\[3\] does not come back "
                                                 "the same from JSON"),
                            (Curator(Arrays()), "Arrays 'arrays': state_dict cannot be stored as JSON")):
        with pytest.raises(StrategyError, match=needle):
            SimTrainer(world, curator, prompts_per_step=4, group_size=4, seed=0).run(1)


@pytest.mark.parametrize("argv, message", [
    (["--check"], "--check: name the strategies to check, e.g. 'rlcurate strategies insight --check' "
                  "('rlcurate strategies' alone lists them)"),
    (["--check", "--options", "{k: 3}"], "--check: name the strategies to check"),
    (["--options", "{k: 3}"], "--options: only with --check and the NAME of the strategy checked, e.g. 'rlcurate "
                              "strategies insight --check --options \"{eta: 0.5}\"' (a training config takes "
                              "strategy_kwargs)"),
    (["insight+dapo", "--check"], "--check: 'insight+dapo' is a composition; check each part ('rlcurate strategies "
                                  "insight dapo --check'): the check of a strategy runs it composed with every other "
                                  "one, both ways"),
    (["uniform", "insight+dapo", "dapo+uniform", "--check"], "--check: 'insight+dapo' is a composition; check each "
                                                             "part ('rlcurate strategies insight dapo uniform --check')"),
    (["ada_est", "--check", "--options", "{hybrid: true, objective: power}"],
     "strategy 'ada_est', strategy_kwargs {'hybrid': True, 'objective': 'power'}: hybrid=True allocates"),
], ids=["check-without-name", "check-options-without-name", "options-without-name", "composition",
        "compositions-among-names", "options-the-strategy-refuses"])
def test_strategies_check_needs_names_and_refuses_a_composition_in_one_line(argv, message, capsys):
    """``--check`` (or ``--options``) without a NAME listed the strategies and exited 0 having checked nothing;
    ``--check`` of a composition printed "FAILED: 'insight+dapo' is not registered" (exit 1) for a valid name;
    options the strategy refuses were reported as the strategy failing the contract. Each is now one line, exit 2,
    before any check runs."""
    assert main(["strategies", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err, captured
    assert captured.err.splitlines() == [captured.err.strip()] and \
        captured.err.startswith(f"rlcurate strategies: error: {message}"), captured.err
