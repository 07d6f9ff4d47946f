"""Tests for the helpers chapters 1-3 added: ``effective_weight`` and ``SoftmaxWorld.score_sq_norm``."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from rlcurate.sim import SoftmaxWorld
from rlcurate.stats import advantages, effective_weight, grpo_effective_weight

P = np.array([0.0, 1e-4, 0.03, 0.2, 0.5, 0.77, 0.999, 1.0])


@pytest.mark.parametrize("G", [1, 2, 3, 8, 17])
@pytest.mark.parametrize("ddof", [0, 1])
def test_effective_weight_of_standardised_is_grpo_effective_weight(G, ddof):
    adv = partial(advantages.standardised, eps=1e-6, ddof=ddof)
    np.testing.assert_allclose(effective_weight(P, G, adv), grpo_effective_weight(P, G, eps=1e-6, ddof=ddof),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("G", [2, 5, 16])
def test_effective_weight_closed_forms(G):
    # RLOO is unbiased for grad p; the group-mean baseline loses a factor (G - 1) / G.
    np.testing.assert_allclose(effective_weight(P, G, advantages.rloo), 1.0, atol=1e-12)
    np.testing.assert_allclose(effective_weight(P, G, advantages.centred), (G - 1) / G, atol=1e-12)
    # RAFT averaged over the accepted samples: A_i = r_i / p_hat, weight pass@G / p.
    def raft_mean(r):
        k = r.sum(axis=-1, keepdims=True)
        return np.where(k > 0, r * r.shape[-1] / np.maximum(k, 1), 0.0)

    q = P[(P > 0)]
    np.testing.assert_allclose(effective_weight(q, G, raft_mean), (1 - (1 - q) ** G) / q, rtol=1e-10)
    assert effective_weight(0.0, G, raft_mean) == pytest.approx(G)


def test_effective_weight_scalar_and_shape():
    w = effective_weight(0.3, 4, advantages.rloo)
    assert isinstance(w, float)
    assert effective_weight(np.full((2, 3), 0.3), 4, advantages.rloo).shape == (2, 3)


def test_effective_weight_monte_carlo():
    """E[(1/G) sum_i A_i s_i] = w(p) grad p, checked with a two-answer softmax where s = r - p."""
    rng = np.random.default_rng(0)
    G, p, reps = 6, 0.23, 400_000
    r = (rng.random((reps, G)) < p).astype(float)
    score = r - p  # d/dz log pi for a Bernoulli(sigmoid(z)); grad p = p (1 - p)
    for adv in (advantages.standardised, advantages.rloo, advantages.centred):
        est = (adv(r) * score).mean(axis=1)
        se = est.std() / np.sqrt(reps)
        assert abs(est.mean() - effective_weight(p, G, adv) * p * (1 - p)) < 5 * se


def test_effective_weight_rejects_bad_input():
    with pytest.raises(ValueError):
        effective_weight(1.5, 4, advantages.rloo)
    with pytest.raises(ValueError):
        effective_weight(0.5, 4, "rloo")
    with pytest.raises(ValueError):
        effective_weight(0.5, 4, lambda r: r[:, :1])
    with pytest.raises(ValueError):
        effective_weight(0.5, 4, lambda r: r / 0.0)


def test_score_sq_norm_matches_identity_and_monte_carlo():
    world = SoftmaxWorld.make(n_prompts=12, seed=3)
    rng = np.random.default_rng(1)
    theta = 0.3 * rng.standard_normal(world.dim)
    S = world.score_sq_norm(theta)
    assert S.shape == (12,) and (S > 0).all()
    # E[(r - b)^2 ||s||^2] at b = 0 and b = 1 add up to E||s||^2 (r is binary).
    g2 = (world.grad_pass_rates(theta) ** 2).sum(axis=1)
    ident = (world.baselined_score_variance(theta, baseline=0.0) + world.baselined_score_variance(theta, baseline=1.0)
             + 2 * g2)
    np.testing.assert_allclose(S, ident, rtol=1e-10)
    groups = world.sample(theta, np.arange(12), 20_000, rng)
    sq = (world.score(theta, groups.prompt, groups.action) ** 2).sum(axis=1)
    mc = np.bincount(groups.group, sq) / groups.sizes
    se = np.sqrt(np.bincount(groups.group, sq**2) / groups.sizes - mc**2) / np.sqrt(groups.sizes)
    assert np.all(np.abs(mc - S) < 5 * se)
    np.testing.assert_allclose(world.score_sq_norm(theta, [2, 5]), S[[2, 5]])


def test_every_public_stats_function_answers_bad_input_in_its_own_words():
    """Issue #30: each public function of rlcurate.stats, given a first argument that is a string, holds NaN or a
    negative rate, or is a 2-D array where one value or one row is meant, raises ValueError or works; never
    numpy's "truth value is ambiguous", a TypeError or an AttributeError from deep inside."""
    import inspect

    import numpy as np

    import rlcurate.stats as S

    bad = {"2d": np.array([[0.1, 0.5], [0.2, 0.3]]), "str": "abc", "nan": [0.1, float("nan")], "neg": [-0.1, 0.5]}
    checked = 0
    for name in dir(S):
        f = getattr(S, name)
        if name.startswith("_") or not inspect.isfunction(f) or name == "mopps_select":  # mopps_select takes beliefs
            continue
        required = [p for p in inspect.signature(f).parameters.values()
                    if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not required:
            continue
        for label, value in bad.items():
            try:
                f(value, *[8] * (len(required) - 1))
            except ValueError as exc:
                assert "ambiguous" not in str(exc), (name, label, exc)
            except Exception as exc:  # noqa: BLE001 - the point is which kind
                raise AssertionError(f"{name}({label}): {type(exc).__name__}: {exc}") from None
        checked += 1
    assert checked >= 30
