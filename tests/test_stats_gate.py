import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcurate.stats import (
    advantage_energy,
    effective_prompt_ratio,
    expected_advantage_energy,
    gate_max,
    gate_open_prob,
    gate_open_prob_small_p,
    is_mixed,
)

probs = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
group_sizes = st.integers(min_value=1, max_value=64)


@given(probs, group_sizes)
def test_gate_matches_definition_and_bounds(p, G):
    u = gate_open_prob(p, G)
    assert 0.0 <= u <= 1.0
    assert u == pytest.approx(1 - (1 - p) ** G - p**G, abs=1e-12)
    assert u <= gate_max(G) + 1e-12
    assert u <= gate_open_prob_small_p(p, G) + 1e-12  # Gp is an upper bound
    assert gate_open_prob(1 - p, G) == pytest.approx(u, abs=1e-12)  # symmetry


@pytest.mark.parametrize("G", [1, 2, 8, 64])
def test_gate_edges(G):
    assert gate_open_prob(0.0, G) == 0.0
    assert gate_open_prob(1.0, G) == 0.0
    assert gate_open_prob(0.5, G) == pytest.approx(gate_max(G))
    assert gate_open_prob(0.3, 1) == 0.0


def test_gate_small_p_is_accurate():
    p = 1e-12
    assert gate_open_prob(p, 8) == pytest.approx(8 * p, rel=1e-9)  # no cancellation


def test_gate_vectorised_and_monte_carlo():
    rng = np.random.default_rng(0)
    p = np.array([0.05, 0.3, 0.5, 0.9])
    u = gate_open_prob(p, 8)
    r = rng.random((200_000, 4, 8)) < p[None, :, None]
    mixed = (r.any(axis=2) & ~r.all(axis=2)).mean(axis=0)
    se = np.sqrt(u * (1 - u) / 200_000)
    assert np.all(np.abs(mixed - u) < 5 * se + 1e-9)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), [0.2, 2.0]])
def test_gate_rejects_bad_p(bad):
    with pytest.raises(ValueError, match="p"):
        gate_open_prob(bad, 4)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "4"])
def test_gate_rejects_bad_G(bad):
    with pytest.raises(ValueError, match="G"):
        gate_open_prob(0.5, bad)


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=32))
def test_energy_zero_iff_gate_closed(rewards):
    mixed = is_mixed(rewards)
    for kind in ("centred", "standardised"):
        e = advantage_energy(rewards, kind)
        assert (e > 0) == mixed
    p_hat = np.mean(rewards)
    assert advantage_energy(rewards, "centred") == pytest.approx(p_hat * (1 - p_hat))


def test_standardised_energy_formula():
    r = np.array([1, 0, 0, 1, 1, 0, 0, 0.0])
    s = r.std()
    assert advantage_energy(r, "standardised", eps=0.1) == pytest.approx(s**2 / (s + 0.1) ** 2)


@given(probs, st.integers(min_value=1, max_value=16))
@settings(max_examples=50)
def test_expected_energy(p, G):
    centred = expected_advantage_energy(p, G, "centred")
    assert centred == pytest.approx(p * (1 - p) * (G - 1) / G, abs=1e-12)
    std = expected_advantage_energy(p, G, "standardised", eps=0.0)
    assert std == pytest.approx(gate_open_prob(p, G), abs=1e-12)


def test_effective_prompt_ratio_ragged():
    groups = [[1, 1, 1], [0, 1], [0], [0, 0, 0, 0], [0.5, 0.2]]
    assert effective_prompt_ratio(groups) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="groups"):
        effective_prompt_ratio([])
    with pytest.raises(ValueError, match="rewards"):
        effective_prompt_ratio([[1.0, float("nan")]])
