"""A training configuration as a dry run trains it (:mod:`rlcurate.dryrun`, appendix A1): cut to a step or
two of short completions, on a random-weight checkpoint of the configured architecture, with coin rewards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcurate.models.dry_run import dry_run_model

__all__ = ["CUT", "cut_changes", "dry_run_config", "coin_reward"]

# The cut-down settings of a CPU dry run: one prompt-group pair per step, short completions.
CUT = {"prompts_per_step": 2, "max_new_tokens": 8, "eval_prompts": 2, "eval_samples": 1,
       "micro_batch_tokens": 4096, "gen_token_budget": 8192}


def cut_changes(config, steps: int) -> dict[str, Any]:
    """The changes of a CPU dry run: :data:`CUT`, ``steps`` steps, one evaluation at the end, nothing saved (no
    checkpoint either: the trainer's ``final_checkpoint`` is off in a dry run), and
    no warm-up where the config's would outlast the steps (the trainer would warn of a cut the dry run made)."""
    changes: dict[str, Any] = {k: v for k, v in CUT.items() if getattr(config, k) > v}
    changes.update(steps=steps, max_rollouts=0, eval_every=steps, eval_every_rollouts=0, checkpoint_every=0,
                   save_model=False, resume=False, progress=False)
    if config.warmup_steps and steps <= config.warmup_steps < config.planned_steps:  # a warm-up the config finishes
        changes["warmup_steps"] = 0
    return changes


def dry_run_config(config):
    """``config`` as a chapter's dry run trains it: at most 2 steps, the cut lengths and sizes, the model of
    :func:`~rlcurate.models.dry_run.dry_run_model`, and an ``out_dir`` in the temporary folder (a dry run
    never writes into a real run's folder: one outside it is replaced by a new temporary one, with a
    warning)."""
    import logging
    import tempfile

    from rlcurate.train.config import TrainConfig

    changes = cut_changes(config, min(config.steps, 2))
    changes.update(device="auto", dtype="auto")  # the GPU configs name cuda; a dry run uses what there is
    stand_in = dry_run_model(config.model)
    if stand_in is not None:
        changes["model"] = str(stand_in)
    tmp = Path(tempfile.gettempdir()).resolve()
    if not Path(config.out_dir).resolve().is_relative_to(tmp):
        changes["out_dir"] = tempfile.mkdtemp(prefix="rlcurate_dryrun_run_")
        logging.getLogger(__name__).warning("dry run: writing to %s, not to %s", changes["out_dir"], config.out_dir)
    return TrainConfig.from_dict({**config.to_dict(), **changes}, source=f"{config.model} (dry run)")


def coin_reward(task) -> None:
    """Make ``task.reward`` call the real verifier, then return 0 or 1 by the parity of the CRC-32 of
    the completion's text (module docstring)."""
    import zlib

    from rlcurate.tasks.base import Reward

    real = task.reward

    def reward(problem, completion):
        verdict = real(problem, completion)
        coin = zlib.crc32(str(completion).encode("utf-8", "replace")) & 1
        return Reward(float(coin), f"dry run: coin {coin} (verifier: {verdict.value:g}, {verdict.reason})")

    task.reward = reward
