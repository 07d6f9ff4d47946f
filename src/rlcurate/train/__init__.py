"""The GRPO trainer (chapter 5, *The GRPO loop*): config, loss, loop, checkpoints, metrics.

The config and its checks (:mod:`rlcurate.train.config`, :mod:`rlcurate.train.preflight`) import
without torch, so ``rlcurate train`` refuses a bad config in about a second; the trainer and the
loss are imported on first use.
"""

from rlcurate.train.config import TrainConfig, field_docs

_LAZY = {"Trainer": "trainer", "MetricsLog": "trainer", "LMPolicy": "policy", "TrainSample": "loss",
         "aggregation_coefficients": "loss", "forward_logprobs": "loss", "policy_loss": "loss"}

__all__ = ["TrainConfig", "Trainer", "MetricsLog", "TrainSample", "aggregation_coefficients",
           "forward_logprobs", "policy_loss", "LMPolicy", "field_docs"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"rlcurate.train.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'rlcurate.train' has no attribute {name!r}")
