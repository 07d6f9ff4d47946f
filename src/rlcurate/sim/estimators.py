"""Policy-gradient estimators on sampled groups of the simulated world (chapters 1-3).

The batch estimator of every group-relative method has the same shape:

    g_hat = (1/B) sum_g  omega_g  (1/n_g) sum_j A_gj grad log pi(a_gj | x_g),

with advantages A from :mod:`rlcurate.stats.advantages` and an optional explicit prompt weight
omega_g (for example f'(p_hat_g), chapter 2).
"""

from __future__ import annotations

import numpy as np

from rlcurate.stats.advantages import ADVANTAGES

__all__ = ["policy_gradient", "group_gradient_estimate"]


def policy_gradient(world, theta, groups, kind: str = "grpo", group_weights=None,
                    normalise: str = "group", **adv_kwargs) -> np.ndarray:
    """The batch estimate g_hat for ``groups`` (a :class:`~rlcurate.sim.world.Groups`).

    ``kind`` picks the advantage (``grpo``, ``centred``, ``rloo``, ``raft``...). ``normalise="group"``
    averages within each group then over groups (the estimator above); ``"batch"`` divides the sum by
    the total number of rollouts (token-mean style when every answer has one token). Groups of size 0
    count toward B but contribute nothing.
    """
    if kind not in ADVANTAGES:
        raise ValueError(f"kind must be one of {sorted(ADVANTAGES)}, got {kind!r}")
    fn = ADVANTAGES[kind]
    if groups.sizes.size and (groups.sizes == groups.sizes[0]).all() and groups.sizes[0] > 0:
        adv = fn(groups.reward.reshape(groups.sizes.size, -1), **adv_kwargs).reshape(-1)
    else:
        per_group = groups.split_rewards()
        adv = np.concatenate([fn(r, **adv_kwargs) if r.size else r for r in per_group] or [np.zeros(0)])
    scores = world.score(theta, groups.prompt, groups.action, groups.hint_level)
    B = groups.sizes.size
    w = np.ones(B) if group_weights is None else np.asarray(group_weights, float)
    if normalise == "group":
        n_g = np.maximum(groups.sizes, 1)[groups.group]
        coef = w[groups.group] * adv / n_g / B
    elif normalise == "batch":
        coef = w[groups.group] * adv / max(groups.n_rollouts, 1)
    else:
        raise ValueError(f"normalise must be 'group' or 'batch', got {normalise!r}")
    return coef @ scores


def group_gradient_estimate(world, theta, prompt: int, n: int, rng: np.random.Generator, reps: int,
                            kind: str = "centred", baseline: str = "true") -> np.ndarray:
    """``reps`` independent estimates of grad p for one prompt from n rollouts each, shape (reps, d).

    ``baseline="true"`` uses r - p (the estimator whose variance chapter 3 derives);
    ``"group"`` uses the advantage ``kind`` computed within each group.
    """
    idx = np.full(reps, prompt)
    g = world.sample(theta, idx, n, rng)
    scores = world.score(theta, g.prompt, g.action)
    if baseline == "true":
        p = world.pass_rates(theta, [prompt])[0]
        adv = g.reward - p
    elif baseline == "group":
        adv = ADVANTAGES[kind](g.reward.reshape(reps, n)).reshape(-1)
    else:
        raise ValueError(f"baseline must be 'true' or 'group', got {baseline!r}")
    contrib = adv[:, None] * scores / n
    out = np.zeros((reps, world.dim))
    np.add.at(out, g.group, contrib)
    return out
