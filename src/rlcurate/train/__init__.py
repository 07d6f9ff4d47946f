"""The GRPO trainer (chapter 5, *The GRPO loop*): config, loss, loop, checkpoints, metrics."""

from rlcurate.train.config import TrainConfig, field_docs
from rlcurate.train.loss import TrainSample, aggregation_coefficients, forward_logprobs, policy_loss
from rlcurate.train.trainer import MetricsLog, Trainer, group_advantages

__all__ = ["TrainConfig", "Trainer", "MetricsLog", "TrainSample", "aggregation_coefficients",
           "forward_logprobs", "policy_loss", "group_advantages", "field_docs"]
