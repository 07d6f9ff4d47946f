"""Supervised warm-start of the tiny model on arithmetic (chapter 4, *The variance audit*).

GRPO learns only from prompts whose sampled groups disagree, so a policy that is to be trained with
RL must already solve some prompts some of the time. This module trains the tiny Qwen2 model from
scratch by next-token prediction on reference completions (scratchpad, ``#``, answer, end of
sequence; the loss covers only the assistant part), with a share of prompts that carry a hint
(the first 1-3 reference steps, chapter 7) so that the model learns to use hints. Along the way it
measures, on held-out prompts, how many of ``n`` samples at temperature 1 are correct, and it can
save several stages of one run. The checkpoints in ``data/tiny`` come from::

    python -m rlcurate.models.warmstart --out data/tiny --steps 2500 --seed 0 \\
        --save-at early=400,spread=max-mixed,saturated=2500 --eval-every 125 --threads 1

(the same as ``rlcurate warmstart ...``; it refuses to overwrite the committed checkpoints unless given ``--force``,
so give another ``--out`` to compare with them). A run is bitwise reproducible for a given seed and number of
threads on one CPU; evaluations and saving draw no randomness from the training stream, so a stage
saved at step k of a long run equals the end of a k-step run (the learning rate is constant after
warm-up). Another processor may round differently: on an AMD EPYC the command above follows the
committed log to the last digit for about 125 steps and then drifts apart (loss 1.35575 against
1.3557 at step 150).

Each checkpoint directory holds the Hugging Face checkpoint (safetensors, tokenizer, chat template),
``train_config.json``, ``train_log.jsonl`` (losses and held-out evaluations with pass-count
histograms), ``rlcurate.json`` and a ``README.md`` with the command, the wall time and the versions.

The evaluations sample through :class:`rlcurate.rollout.TransformersEngine` (since issue #14; before
it, through ``torch.multinomial`` with a private generator in this module). They draw nothing from
the training stream, so a stage saved at a fixed step has the same weights with either sampler (a
run with an evaluation at step 125 by either sampler, or none, has the same loss at step 150); the
held-out pass counts differ sample by sample (``spread``: mean pass 0.4149 and 56% of the prompts
mixed with the earlier sampler, 0.4119 and 58% with the engine), and with them the step a
``max-mixed`` stage may pick. The checkpoints in ``data/tiny`` were made before the change: their
logs and READMEs hold the earlier sampler's numbers, and ``spread`` is the step 750 it picked (a
rerun of the command to step 1125 picked step 750 with both samplers).

==============================================  ====================================================
:mod:`~rlcurate.models.warmstart.config`        :class:`WarmStartConfig`, :func:`parse_save_at`
:mod:`~rlcurate.models.warmstart.data`          supervised examples and length-bucketed batches
:mod:`~rlcurate.models.warmstart.evaluation`    held-out pass counts, their summary, hint effects
:mod:`~rlcurate.models.warmstart.training`      :func:`train`: the loop, evaluations and stages
:mod:`~rlcurate.models.warmstart.readme`        the checkpoints' READMEs
:mod:`~rlcurate.models.warmstart.cli`           the command line and its round trip (:func:`to_argv`)
==============================================  ====================================================
"""

from rlcurate.models.warmstart.cli import build_parser, config_from_args, main, to_argv
from rlcurate.models.warmstart.config import MAX_MIXED, TINY_LEVEL_WEIGHTS, WarmStartConfig, parse_save_at
from rlcurate.models.warmstart.data import BUCKETS, encode_example, make_batches
from rlcurate.models.warmstart.evaluation import (hint_effect, max_completion_tokens, pass_counts,
                                                  sample_completions, summarize_counts)
from rlcurate.models.warmstart.readme import format_hint_effect, format_summary
from rlcurate.models.warmstart.training import learning_rate, train

__all__ = [
    "BUCKETS",
    "MAX_MIXED",
    "TINY_LEVEL_WEIGHTS",
    "WarmStartConfig",
    "build_parser",
    "config_from_args",
    "encode_example",
    "format_hint_effect",
    "format_summary",
    "hint_effect",
    "learning_rate",
    "main",
    "make_batches",
    "max_completion_tokens",
    "parse_save_at",
    "pass_counts",
    "sample_completions",
    "summarize_counts",
    "to_argv",
    "train",
]
