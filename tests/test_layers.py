"""The package's layers (issue #14): no module imports from a layer above its own, the trainer knows
no strategy, and the simulated world does not depend on the trainer.

Layers, from the bottom (a module may import its own layer and those below):

0. leaves: the package root, ``_validate``, ``errors``, ``seeding``, ``_help``, ``provenance``,
   ``book.style`` (no other rlcurate import)
1. ``stats``: closed-form math on pass rates (numpy and scipy only)
2. ``tasks``: prompt sources and verifiers
3. ``models``: building and loading checkpoints
4. ``rollout``: generation backends
5. ``policy``: what a step asks of the model being trained
6. ``curation``: the strategies and the step loop
7. ``train``, ``sim``, ``audit``, ``interop``: the worlds and tools built on the loop
8. programs: ``cli``, ``__main__``, ``experiments``, ``analysis``, ``compare``, ``presets``, ``book``, the
   command-line modules (``audit.cli``, ``models.warmstart``, ``rollout.server``), ``plan``, ``dryrun``,
   ``replay``, ``conditions``, ``advise``, ``contract``

Imports used only for type checking (``if TYPE_CHECKING:``) and those in an ``if __name__ ==
"__main__":`` block (a module run as a program goes through the command line) are not dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlcurate"

LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ("rlcurate", 0), ("rlcurate._validate", 0), ("rlcurate.errors", 0), ("rlcurate.seeding", 0),
    ("rlcurate._help", 0), ("rlcurate.provenance", 0), ("rlcurate.book.style", 0),
    ("rlcurate.stats", 1), ("rlcurate.tasks", 2), ("rlcurate.models", 3), ("rlcurate.rollout", 4),
    ("rlcurate.policy", 5), ("rlcurate.curation", 6),
    ("rlcurate.train", 7), ("rlcurate.sim", 7), ("rlcurate.audit", 7), ("rlcurate.interop", 7),
    ("rlcurate.cli", 8), ("rlcurate.__main__", 8), ("rlcurate.experiments", 8), ("rlcurate.analysis", 8),
    ("rlcurate.presets", 8), ("rlcurate.compare", 8), ("rlcurate.book", 8), ("rlcurate.audit.cli", 8), ("rlcurate.audit.__main__", 8),
    ("rlcurate.models.warmstart", 8), ("rlcurate.rollout.server", 8), ("rlcurate.plan", 8), ("rlcurate.dryrun", 8),
    ("rlcurate.replay", 8), ("rlcurate.conditions", 8), ("rlcurate.advise", 8), ("rlcurate.contract", 8),
]
CURATION_INTERFACE = ("rlcurate.curation", "rlcurate.curation.base", "rlcurate.curation.step",
                      "rlcurate.curation.registry")


def layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def _skipped(node: ast.If) -> bool:
    test = ast.unparse(node.test)
    return test in ("TYPE_CHECKING", "typing.TYPE_CHECKING") or test.replace("'", '"') == '__name__ == "__main__"'


def imports(path: Path) -> set[str]:
    """The rlcurate modules ``path`` imports (at any depth, outside the skipped blocks)."""
    found: set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and _skipped(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rlcurate"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rlcurate"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names
                         if (SRC.parent / f"{node.module}.{a.name}".replace(".", "/")).with_suffix(".py").exists())
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def module_name(path: Path) -> str:
    return ".".join(("rlcurate", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")


GRAPH = {module_name(p): imports(p) for p in SRC.rglob("*.py")}


def test_no_module_imports_from_a_higher_layer():
    upward = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                    for m, targets in GRAPH.items() for t in targets if layer(t) > layer(m))
    assert not upward, "\n".join(upward)


def test_the_trainer_imports_no_strategy():
    strategies = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if m.startswith("rlcurate.train")
                        for t in targets if t.startswith("rlcurate.curation") and t not in CURATION_INTERFACE)
    assert not strategies, "\n".join(strategies)


def test_the_simulated_world_does_not_depend_on_the_trainer():
    found = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if m.startswith("rlcurate.sim")
                   for t in targets if t.startswith("rlcurate.train"))
    assert not found, "\n".join(found)


def test_the_checker_sees_imports_at_any_depth():
    # the rules above would pass vacuously if the parser missed function-level imports
    assert "rlcurate.curation.step" in GRAPH["rlcurate.train.trainer"]
    assert any(t.startswith("rlcurate.models") for t in GRAPH["rlcurate.train.trainer"])  # inside __init__
    assert layer("rlcurate.curation.sage") == 6 and layer("rlcurate.audit.cli") == 8
