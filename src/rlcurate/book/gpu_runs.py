"""The training runs the chapters' GPU cells make, declared once.

A chapter's GPU cell (run in the ``gpu`` profile, or in a dry run, :func:`rlcurate.book.gpu_cells`) trains a few
short runs of one of ``configs/gpu_*.yaml`` or of a GPU suite's arms. :data:`CHAPTER_GPU_RUNS` says which
configuration, which arms (their ``key=value`` overrides) and how many steps per profile; the chapter trains the
configs :func:`chapter_gpu_configs` builds, and appendix A1 prices the very same configs with ``rlcurate plan``,
so that the minutes it prints cannot drift from what the chapters run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlcurate.book.profiles import by_profile

REPO = Path(__file__).resolve().parents[3]
UNIFORM = ("strategy=uniform", "strategy_kwargs={}")


@dataclass(frozen=True)
class GpuRuns:
    """One chapter's GPU runs: ``source`` is a config (``configs/X.yaml``) or a suite (``configs/suites/X.yaml``,
    its arms' seed-0 configs); ``arms`` maps a name to its overrides (for a suite: the suite's run names, no
    overrides); ``steps`` the steps per profile (smoke, cpu, gpu; ``None``: the config's own); ``eval_at_end``
    evaluates after the last step; ``overrides`` apply to every arm."""

    source: str
    arms: dict[str, tuple[str, ...]]
    steps: tuple[int, int, int] | None = None
    eval_at_end: bool = False
    overrides: tuple[str, ...] = ()

    def steps_for(self, profile: str) -> int | None:
        if self.steps is None:
            return None
        smoke, cpu, gpu = self.steps
        return by_profile(profile, smoke=smoke, cpu=cpu, gpu=gpu)


CHAPTER_GPU_RUNS: dict[str, GpuRuns] = {
    "05_grpo_loop": GpuRuns("configs/gpu_grpo_qwen25_05b_gsm8k.yaml", {"grpo": ()}, (2, 0, 10), eval_at_end=True,
                            overrides=("progress=false",)),
    "06_adaptive_sampling": GpuRuns("configs/gpu_ada_seq_qwen25_math_15b.yaml",
                                    {"ada_seq_balanced": (), "uniform_n4": UNIFORM}, (2, 8, 8)),
    "07_hinting": GpuRuns("configs/gpu_sage_qwen25_05b_math.yaml", {"sage": (), "uniform": UNIFORM}, (2, 6, 6),
                          eval_at_end=True),
    "08_dro": GpuRuns("configs/gpu_dro_qwen25_05b_gsm8k.yaml", {"dro": ()}),
    "09_insight": GpuRuns("configs/gpu_insight_qwen3_06b_countdown.yaml",
                          {"uniform": ("strategy=uniform",), "insight": ("strategy=insight",)}, (2, 6, 6),
                          eval_at_end=True),
    "10_end_to_end": GpuRuns("configs/suites/gpu_end_to_end_gsm8k.yaml", {"uniform": (), "combined": ()},
                             overrides=(f"max_rollouts={32 * 8 * 30}",)),
}
"""Per chapter (the notebook's stem), the runs its GPU cells train."""


def chapter_gpu_configs(chapter: str, profile: str, work: str | Path = "runs") -> dict:
    """The :class:`~rlcurate.train.config.TrainConfig` of each arm of ``chapter``'s GPU runs in ``profile``,
    writing to ``work/gpu/<arm>`` and starting afresh (``resume=false``). Building them creates nothing, so a
    plan may leave ``work`` at its default."""
    from rlcurate.train.config import TrainConfig, apply_overrides

    runs = CHAPTER_GPU_RUNS[chapter]
    steps = runs.steps_for(profile)
    suite = None
    if "/suites/" in runs.source:
        from rlcurate.experiments import load_suite, run_config

        suite = load_suite(REPO / runs.source)
    out = {}
    for arm, arm_overrides in runs.arms.items():
        over = [*arm_overrides, *runs.overrides, f"out_dir={Path(work) / 'gpu' / arm}", "resume=false"]
        if steps is not None:
            over.append(f"steps={steps}")
            if runs.eval_at_end:
                over.append(f"eval_every={steps}")
        if suite is not None:
            base = run_config(suite, arm, suite["seeds"][0], Path(work) / "gpu").to_dict()
            out[arm] = TrainConfig.from_dict(apply_overrides(base, over), source=f"{runs.source}: run {arm!r}")
        else:
            out[arm] = TrainConfig.load(REPO / runs.source, over)
    return out
