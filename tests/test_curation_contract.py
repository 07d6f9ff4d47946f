"""The strategy contract a researcher runs on a strategy of their own (``rlcurate.contract``,
``rlcurate strategies NAME --check``), and strategies kept outside the package (``RLCURATE_STRATEGIES``)."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

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
    monkeypatch.delenv(registry.PLUGINS_ENV)
    with pytest.raises(UserError, match=r"a strategy in a file of your own: RLCURATE_STRATEGIES=path/to/it.py"):
        build_curator("my_own_strategy")
