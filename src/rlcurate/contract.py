"""The contract every strategy keeps, checked in seconds in the simulated world (src/rlcurate/curation/README.md,
*Testing it*): ``rlcurate strategies NAME --check``, or in a test::

    from rlcurate.contract import check_strategy

    def test_my_strategy_keeps_the_contract():
        check_strategy("skip_solved", k=3)   # raises AssertionError naming what broke

The checks, each on a world of :data:`WORLD` (chapter 1's spread of pass rates, shared skills):

1. **described**: a docstring, and every option with a default and a docstring (``rlcurate strategies NAME``);
2. **trains**: :data:`STEPS` steps of :class:`~rlcurate.sim.bridge.SimTrainer`, every trained prompt an index
   of the pool, the rollouts counted, every sample the policy drew charged to the step (none drawn around
   ``ctx.generate``), the held-out pass rate finite;
3. **deterministic**: the same seed gives the same run, record for record (random choices drawn from global
   state, not from ``ctx.rng`` or a named stream, break this);
4. **resumes exactly**: its state through JSON half-way (a checkpoint), a fresh curator continues to the same
   records and parameters;
5. **an A/A control**: the run is valid at another ``order_offset``; a first choice that does not change with it
   is noted in the report (an A/A control of the strategy would repeat the run): a fixed rule, or draws from a
   generator seeded with a constant instead of ``ctx.rng`` or the part's ``seed`` (the two look alike from
   outside, so it is a note, not a failure);
6. **composes**: its selector with the sampler and processors of every registered strategy that runs in the
   simulated world, and theirs with its own, two steps each (a composition refused with one line is listed,
   not failed);
7. **needs numpy alone**: building it in a process that cannot import torch.

What it cannot check is whether the strategy helps: that is chapters 10 and 11's protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np

WORLD = {"n_prompts": 160, "pass_rate_beta": (0.5, 0.5), "seed": 0}
STEPS = 12
TRAINER = {"prompts_per_step": 8, "group_size": 4}
BLOCK_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: this process runs without torch)")
            return None

    sys.meta_path.insert(0, NoTorch())
""")
"""The start of a Python program in which ``import torch`` fails (the *numpy alone* check)."""


def check_strategy(name: str, steps: int = STEPS, compositions: bool = True, numpy_alone: bool = True,
                   **kwargs) -> dict[str, Any]:
    """Run the module docstring's checks on strategy ``name`` with options ``kwargs`` (``compositions`` and
    ``numpy_alone`` switch the slowest two off); an :class:`AssertionError` names the first that fails.
    Returns what ran: ``{"checks": [...], "composed": [...], "refused": {spec: reason}, "not_in_sim": [...],
    "notes": [...]}``."""
    from rlcurate.config_cli import field_docs
    from rlcurate.curation.registry import available, config_class, options

    _require(name in available(),
             f"{name!r} is not registered (a file of your own: RLCURATE_STRATEGIES=path/to/it.py)")
    cls = config_class(name)
    _require((cls.__doc__ or "").strip(), f"{name}: the configuration class has no docstring")
    undocumented = sorted(set(options(name)) - set(field_docs(cls)))
    _require(not undocumented, f"{name}: options without a docstring right below them: {undocumented}")
    done = ["described"]

    try:
        full, trainer = _run(name, kwargs, steps, seed=1)
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{name} does not run in the simulated world ({type(exc).__name__}: {exc}); the "
                             f"contract's checks need it") from exc
    pool = len(trainer.train_problems)
    for step, picked in enumerate(trainer.sampled_prompts, 1):
        _require(picked and all(0 <= i < pool for i in picked),
                 f"{name}: step {step} rolled out {picked} (pool {pool})")
    _require(trainer.rollouts == sum(r["rollouts"] for r in full.records) > 0, f"{name}: rollouts not counted")
    # the policy counts what it sampled; in this world a completion is one token, and an oracle's free estimates
    # are counted apart
    charged = trainer.generated_tokens + trainer.uncharged_rollouts
    _require(trainer.policy.sampled_tokens == charged, (
        f"{name}: the policy sampled {trainer.policy.sampled_tokens} tokens, the step's counters charged {charged}: "
        f"draw rollouts with ctx.generate (text for the strategy itself with ctx.generate_text), never around it"))
    _require(np.isfinite(full.column("held_out")).all(), f"{name}: the held-out pass rate is not finite")
    done.append("trains")

    again, _ = _run(name, kwargs, steps, seed=1)
    _require(_same(again.records, full.records), (
        f"{name}: two runs with the same seed differ ({_first_diff(again.records, full.records)}): draw random "
        f"choices from ctx.rng or a named stream keyed on the part's seed, never from numpy's global generator; "
        f"and let build() make new parts each time (parts made once, at import, carry one run's state into the "
        f"next)"))
    done.append("deterministic")

    half = steps // 2
    first, tr1 = _run(name, kwargs, half, seed=1)
    try:
        state = json.loads(json.dumps(tr1.curator.state_dict()))  # a checkpoint stores it as JSON
        tr2 = _trainer(name, kwargs, seed=1, theta=tr1.theta)
        tr2.curator.load_state_dict(state)
        tr2.step, tr2.rollouts = tr1.step, tr1.rollouts
        rest = tr2.run(steps - half)
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(
            f"{name}: resuming from its state_dict after a JSON round trip fails ({type(exc).__name__}: {exc}): the "
            f"state must survive JSON (an int-keyed map comes back with string keys: store it as rows)") from exc
    resumed = first.records + rest.records[1:]
    _require(_same(resumed, full.records) and np.array_equal(tr2.theta, trainer.theta), (
        f"{name}: a run resumed from its state_dict at step {half} differs ({_first_diff(resumed, full.records)}): "
        f"put everything the strategy learns in state_dict / load_state_dict"))
    done.append("resumes exactly")

    report: dict[str, Any] = {"checks": done, "composed": [], "refused": {}, "not_in_sim": [], "notes": []}
    other, offset_trainer = _run(name, kwargs, steps, seed=1, order_offset=1000)
    _require(np.isfinite(other.column("held_out")).all(), f"{name}: the A/A arm (order_offset=1000) fails")
    if trainer.sampled_prompts[0] == offset_trainer.sampled_prompts[0]:  # the same pool: the run seed is the same
        report["notes"].append("its first choice does not change with order_offset, so an A/A control of it would "
                               "repeat the run: a fixed rule, or draws not taken from ctx.rng or the part's seed "
                               "(set by bind: the run seed plus order_offset)")
    done.append("A/A control")

    if compositions:
        _compose(name, kwargs, report)
        done.append("composes")
    if numpy_alone:
        _numpy_alone(name, cls)
        done.append("numpy alone")
    return report


# ---------------------------------------------------------------------------------------------- helpers
def _require(ok, message: str) -> None:
    """An :class:`AssertionError` naming what broke (not ``assert``, which ``python -O`` strips)."""
    if not ok:
        raise AssertionError(message)


def _trainer(strategy: str, kwargs: dict, seed: int, theta=None, order_offset: int = 0):
    from rlcurate.curation.registry import build_curator
    from rlcurate.sim.bridge import SimTrainer
    from rlcurate.sim.world import SoftmaxWorld

    world = SoftmaxWorld.make(**WORLD)
    return SimTrainer(world, build_curator(strategy, **kwargs), seed=seed, theta=theta, order_offset=order_offset,
                      **TRAINER)


def _run(strategy: str, kwargs: dict, steps: int, seed: int, order_offset: int = 0):
    trainer = _trainer(strategy, kwargs, seed, order_offset=order_offset)
    return trainer.run(steps), trainer


def _same(a: list[dict], b: list[dict]) -> bool:
    return json.dumps(a, sort_keys=True, default=float) == json.dumps(b, sort_keys=True, default=float)


def _first_diff(a: list[dict], b: list[dict]) -> str:
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            if json.dumps(ra.get(key), default=float) != json.dumps(rb.get(key), default=float):
                return f"step {ra.get('step')}, {key}: {ra.get(key)!r} vs {rb.get(key)!r}"
    return f"{len(a)} vs {len(b)} records"


def _compose(name: str, kwargs: dict, report: dict[str, Any]) -> None:
    from rlcurate.curation.registry import available, discarded_options
    from rlcurate.errors import UserError

    for other in available():
        if other == name:
            continue
        try:  # a strategy that cannot run in the simulated world alone (DRO needs a language model)
            _run(other, {}, 1, seed=0)
        except Exception:  # noqa: BLE001 (any reason: it is the other strategy's, and said so)
            report["not_in_sim"].append(other)
            continue
        for spec in (f"{name}+{other}", f"{other}+{name}"):
            first = spec.startswith(f"{name}+")
            kept = {k: v for k, v in kwargs.items() if k not in discarded_options(name, kwargs, first)}
            split = {name: kept} if kept else {}
            try:
                _run(spec, split, 2, seed=0)
            except UserError as exc:  # refused with one line: a valid answer
                report["refused"][spec] = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001
                raise AssertionError(f"{spec}: {type(exc).__name__}: {exc}") from exc
            report["composed"].append(spec)


def _numpy_alone(name: str, cls) -> None:
    import rlcurate.curation
    from rlcurate.curation.registry import PLUGINS_ENV

    env = dict(os.environ)
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    here = os.path.dirname(rlcurate.curation.__file__)
    if path and not os.path.samefile(os.path.dirname(path), here):  # outside the package's folder: name its file
        env[PLUGINS_ENV] = os.pathsep.join(filter(None, [env.get(PLUGINS_ENV), path]))
    code = BLOCK_TORCH + f"from rlcurate.curation import build_curator\n\nbuild_curator({name!r})\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    last = (res.stderr.strip().splitlines() or [""])[-1]
    _require(res.returncode == 0,
             f"{name}: building it needs more than numpy ({last}); import torch inside the method that uses it")
