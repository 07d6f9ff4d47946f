"""A simulated world of prompts with known pass rates and exact policy gradients (chapters 1-3, 9).

Each prompt is a small multiple-choice problem answered by a softmax policy whose parameters are
shared across prompts, so that learning on one prompt moves others of the same skill, as in a language
model. Everything an RL step needs is available in closed form: pass rates, their gradients, the
score function of any sampled answer, and the exact covariance of per-sample gradient estimates.
"""

from rlcurate.sim.world import SoftmaxWorld, Groups
from rlcurate.sim.estimators import policy_gradient, group_gradient_estimate

__all__ = ["SoftmaxWorld", "Groups", "policy_gradient", "group_gradient_estimate"]
