import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlcurate.stats.advantages import advantages_by_group, centred, raft, rloo, standardised

groups = st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=16)


@given(groups)
def test_uniform_groups_give_zero_advantage(r):
    r = np.array(r)
    if r.min() == r.max():
        for fn in (standardised, centred, rloo):
            assert np.all(fn(r) == 0)


def test_known_values():
    r = np.array([1.0, 0.0, 0.0, 1.0])
    assert np.allclose(centred(r), [0.5, -0.5, -0.5, 0.5])
    assert np.allclose(rloo(r), [1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3])
    assert np.allclose(standardised(r, eps=0.0), (r - 0.5) / np.std(r, ddof=1))
    assert np.allclose(centred(r, baseline=0.25), r - 0.25)
    assert np.allclose(raft(r), r)
    assert standardised(np.array([1.0])).tolist() == [0.0]


def test_batched_matches_per_group():
    rng = np.random.default_rng(0)
    R = (rng.random((50, 8)) < 0.4).astype(float)
    for fn in (standardised, centred, rloo):
        assert np.allclose(fn(R), np.stack([fn(r) for r in R]))
    base = rng.random(50)
    assert np.allclose(centred(R, base), R - base[:, None])


def test_advantages_by_group_ragged_and_errors():
    out = advantages_by_group([[1, 0], [1, 1, 0]], "rloo")
    assert len(out) == 2 and out[1].shape == (3,)
    with pytest.raises(ValueError, match="kind"):
        advantages_by_group([[1]], "ppo")
    with pytest.raises(ValueError, match="rewards"):
        standardised(np.array([1.0, np.nan]))
