"""The strategy contract (issue #14): the worked example of ``src/rlcurate/curation/README.md``, run
exactly as written, is a whole strategy in one new file; and registration needs no hand-kept list of
modules and no torch."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlcurate.curation as package
from rlcurate.cli import main
from rlcurate.contract import BLOCK_TORCH
from rlcurate.curation import available, build_curator, registry
from rlcurate.errors import UserError
from rlcurate.sim import SoftmaxWorld
from rlcurate.sim.bridge import SimTrainer

README = Path(package.__file__).with_name("README.md")
MODULE = "skip_solved"


def example_code() -> str:
    """The first ``python`` block after the heading that names the example's file."""
    text = README.read_text()
    heading = text.index(f"## A worked example: `{MODULE}.py`")
    block = re.search(r"```python\n(.*?)```", text[heading:], re.S)
    assert block, "the README's worked example has no python block"
    return block.group(1)


@pytest.fixture
def new_strategy_file(tmp_path):
    """The example written as a new module file of the package ``rlcurate.curation`` (a folder added
    to its ``__path__``, where discovery looks exactly as it does in src/rlcurate/curation/); the
    package, the registry and ``sys.modules`` are restored afterwards."""
    (tmp_path / f"{MODULE}.py").write_text(example_code())
    available()  # the built-in strategies are discovered before, and kept after
    saved = dict(registry._REGISTRY), set(registry._IMPORTED)
    package.__path__.append(str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield tmp_path
    finally:
        package.__path__.remove(str(tmp_path))
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved[0])
        registry._IMPORTED.clear()
        registry._IMPORTED.update(saved[1])
        sys.modules.pop(f"{package.__name__}.{MODULE}", None)
        if hasattr(package, MODULE):
            delattr(package, MODULE)


def test_the_worked_example_is_a_whole_strategy_in_one_new_file(new_strategy_file, capsys):
    assert [p.name for p in new_strategy_file.iterdir()] == [f"{MODULE}.py"]
    assert MODULE in available()
    curator = build_curator(MODULE)
    assert curator.name == MODULE and curator.selector.k == 2
    assert build_curator(MODULE, k=3).selector.k == 3

    # its options, with their defaults and docstrings, on the command line
    assert main(["strategies", MODULE]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{MODULE}\n\n  Skip solved prompts")
    assert "    k = 2\n        Visits, every one of them solved, after which a prompt is skipped." in out
    assert main(["strategies"]) == 0
    assert f"  {MODULE:20s}  Skip solved prompts" in capsys.readouterr().out

    # checked like every strategy: a misspelt option before anything is built, a bad value when built
    with pytest.raises(UserError, match=r"does not take kk \(did you mean 'k'\?\)"):
        build_curator(MODULE, kk=3)
    with pytest.raises(UserError, match=r"strategy 'skip_solved'.*k must be an integer >= 1, got 0"):
        build_curator(MODULE, k=0)
    # and it composes: its selector with another strategy's sampler and processors
    both = build_curator(f"{MODULE}+ada_seq_balanced", k=1, max_rounds=2)
    assert both.selector.k == 1 and both.sampler.max_rounds == 2 and both.processors


def test_the_worked_example_trains_and_skips_solved_prompts(new_strategy_file):
    # half the prompts almost always solved, half hard; 32 training prompts, 8 per step: an epoch is 4 steps
    world = SoftmaxWorld.make(n_prompts=40, pass_rates=[0.995] * 20 + [0.3] * 20, seed=0)
    trainer = SimTrainer(world, build_curator(MODULE), prompts_per_step=8, group_size=4, seed=0)
    selector = trainer.curator.selector
    chosen, solved_before = [], []
    select = selector.select

    def recording(ctx, k):
        solved_before.append({i for i in range(selector.n_items) if selector.solved(i)})
        chosen.append(select(ctx, k))
        return chosen[-1]

    selector.select = recording
    result = trainer.run(16)
    skipped = np.array([r["curation/skip_solved_skipped"] for r in result.records[1:]])
    assert skipped[:8].sum() == 0  # nothing can be solved twice before the third epoch
    assert skipped.sum() >= 8  # the easy prompts are passed over from then on
    for step, (solved, picked) in enumerate(zip(solved_before, chosen)):
        assert len(picked) == 8
        assert not solved & set(picked), f"step {step} trained on prompts solved at their last 2 visits"
    p0 = world.pass_rates(world.init_theta())
    easy = {i for i, p in enumerate(trainer.train_problems) if p0[p.meta["prompt"]] > 0.9}
    late = [i for picked in chosen[8:] for i in picked]
    assert sum(i in easy for i in late) <= len(late) // 4  # uniform: about half (16 of the 32 are easy)

    # the state round-trips, so that a resumed run continues exactly
    state = trainer.curator.state_dict()
    fresh = build_curator(MODULE)
    fresh.bind(len(trainer.train_problems), 0)
    fresh.load_state_dict(state)
    assert fresh.selector.history == selector.history and fresh.selector.state_dict() == selector.state_dict()
    assert np.isfinite(result.column("held_out")).all()


def test_a_strategy_is_registered_by_its_module_alone(tmp_path):
    """Discovery imports every module of the package: no hand-kept list of strategy modules."""
    src = Path(package.__file__).read_text() + Path(registry.__file__).read_text()
    assert "BUILTIN_MODULES" not in src
    found = {m.name for m in __import__("pkgutil").iter_modules(package.__path__)}
    assert {"ada_seq", "ada_est", "sage", "selection", "dro"} <= found
    assert {"ada_seq_balanced", "ada_est", "sage", "insight", "dro", "uniform"} <= set(available())


def test_registration_refuses_what_the_command_line_could_not_describe():
    from dataclasses import dataclass

    with pytest.raises(TypeError, match="needs a @dataclass subclass of StrategyConfig"):
        registry.register("nope")(type("Nope", (), {}))

    @dataclass
    class NoDefault(registry.StrategyConfig):
        """A strategy whose option has no default."""

        x: int

    with pytest.raises(TypeError, match="option 'x' needs a default"):
        registry.register("no_default")(NoDefault)

    @dataclass
    class NoDoc(registry.StrategyConfig):
        x: int = 1

    with pytest.raises(TypeError, match="needs a docstring"):
        registry.register("no_doc")(NoDoc)
    assert not {"nope", "no_default", "no_doc"} & set(available())


def test_every_option_of_every_strategy_has_a_docstring():
    from rlcurate.config_cli import field_docs

    for name in available():
        cls = registry.config_class(name)
        missing = set(registry.options(name)) - set(field_docs(cls))
        assert not missing, f"{name}: options without a docstring: {sorted(missing)}"


def test_build_curator_needs_numpy_alone():
    """``build_curator("uniform")`` (and discovering every strategy) in a process where torch cannot be
    imported: no strategy module imports it at import time."""
    code = BLOCK_TORCH + textwrap.dedent("""
        from rlcurate.curation import available, build_curator

        names = available()
        assert "uniform" in names and "dro" in names and "sage" in names, names
        assert build_curator("uniform").name == "uniform"
        assert build_curator("insight+ada_seq_balanced").name == "insight+ada_seq_balanced"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
        assert not loaded, loaded
        print("ok", len(names))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok ")
