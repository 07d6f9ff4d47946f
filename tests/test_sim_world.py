import numpy as np
import pytest

from rlcurate.sim import SoftmaxWorld, group_gradient_estimate, policy_gradient
from rlcurate.stats import get_objective, grpo_effective_weight


@pytest.fixture(scope="module")
def world():
    return SoftmaxWorld.make(n_prompts=64, n_actions=6, n_correct=2, seed=3)


def test_initial_pass_rates_are_the_drawn_ones():
    p0 = np.linspace(0.01, 0.99, 10)
    w = SoftmaxWorld.make(n_prompts=10, pass_rates=p0, seed=1)
    assert np.allclose(w.pass_rates(w.init_theta()), p0)
    with pytest.raises(ValueError, match="pass_rates"):
        SoftmaxWorld.make(n_prompts=3, pass_rates=[0.5, 0.5])


def test_probabilities_and_gradient_are_exact(world):
    rng = np.random.default_rng(0)
    theta = rng.normal(size=world.dim) * 0.5
    pi = world.probs(theta)
    assert np.allclose(pi.sum(1), 1)
    g = world.grad_pass_rates(theta)
    h = 1e-6
    fd = np.stack([(world.pass_rates(theta + h * e) - world.pass_rates(theta - h * e)) / (2 * h)
                   for e in np.eye(world.dim)], axis=1)
    assert np.allclose(g, fd, atol=1e-8)
    obj = get_objective("log", delta=1e-6)  # below the world's smallest pass rate: no clipping
    gj = world.grad_objective(theta, obj)
    fdj = np.array([(world.objective(theta + h * e, obj) - world.objective(theta - h * e, obj)) / (2 * h)
                    for e in np.eye(world.dim)])
    assert np.allclose(gj, fdj, atol=1e-6)


def test_score_function_has_mean_zero_and_gives_grad_p(world):
    theta = np.full(world.dim, 0.2)
    pi = world.probs(theta, [5])[0]
    scores = np.stack([world.score(theta, [5], [m])[0] for m in range(pi.size)])
    assert np.allclose(pi @ scores, 0, atol=1e-12)
    assert np.allclose((pi * world.correct) @ scores, world.grad_pass_rates(theta, [5])[0])


def test_sampling_frequencies(world):
    rng = np.random.default_rng(1)
    theta = world.init_theta()
    g = world.sample(theta, [0, 1, 2], [20_000, 0, 5], rng)
    assert g.sizes.tolist() == [20_000, 0, 5] and g.n_rollouts == 20_005
    p = world.pass_rates(theta, [0])[0]
    assert g.rewards_of(0).mean() == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / 20_000) + 1e-9)
    assert [r.size for r in g.split_rewards()] == [20_000, 0, 5]


def test_unbiased_baselined_estimator_and_exact_variance(world):
    rng = np.random.default_rng(2)
    theta = world.init_theta()
    i = int(np.argmin(np.abs(world.pass_rates(theta) - 0.4)))
    est = group_gradient_estimate(world, theta, i, n=4, rng=rng, reps=100_000)
    g = world.grad_pass_rates(theta, [i])[0]
    se = est.std(axis=0) / np.sqrt(est.shape[0])
    assert np.all(np.abs(est.mean(axis=0) - g) < 5 * se + 1e-12)
    measured = est.var(axis=0).sum()
    predicted = world.baselined_score_variance(theta, [i])[0] / 4
    assert measured == pytest.approx(predicted, rel=0.03)


def test_expected_grpo_update_is_grpo_weight_times_grad_p(world):
    rng = np.random.default_rng(5)
    theta = world.init_theta()
    i = int(np.argmin(np.abs(world.pass_rates(theta) - 0.3)))
    G = 4
    groups = world.sample(theta, np.full(100_000, i), G, rng)
    est = policy_gradient(world, theta, groups, kind="grpo", ddof=0)
    p = world.pass_rates(theta, [i])[0]
    pred = grpo_effective_weight(p, G, ddof=0) * world.grad_pass_rates(theta, [i])[0]
    assert np.allclose(est, pred, atol=0.03 * np.abs(pred).max())


def test_hints_raise_pass_rates(world):
    theta = world.init_theta()
    p0 = world.pass_rates(theta)
    p2 = world.pass_rates(theta, hint_level=2)
    assert np.all(p2 > p0)


def test_prompts_out_of_reach_are_the_hardest_and_never_move():
    """``out_of_reach``: the share of lowest starting pass rate stays where it starts whatever theta (a floor the
    policy never learns, chapter 11); the others learn as before, and 0 draws the very same world."""
    p0 = np.linspace(0.01, 0.99, 20)[::-1]
    plain = SoftmaxWorld.make(n_prompts=20, pass_rates=p0, n_skills=2, seed=4)
    floor = SoftmaxWorld.make(n_prompts=20, pass_rates=p0, n_skills=2, out_of_reach=0.25, seed=4)
    assert np.array_equal(SoftmaxWorld.make(n_prompts=20, pass_rates=p0, n_skills=2, out_of_reach=0.0, seed=4).features,
                          plain.features)
    theta = np.random.default_rng(0).normal(size=plain.dim) * 3
    moved = ~np.isclose(floor.pass_rates(theta), p0)
    assert np.array_equal(np.flatnonzero(~moved), np.sort(np.argsort(p0)[:5]))  # the 5 hardest, and only they, stay
    assert np.allclose(floor.pass_rates(theta)[moved], plain.pass_rates(theta)[moved])
    assert np.allclose(floor.grad_pass_rates(theta)[~moved], 0.0)
    for bad in (1.0, -0.1, True, "0.2"):
        with pytest.raises(ValueError, match="out_of_reach"):
            SoftmaxWorld.make(n_prompts=4, out_of_reach=bad)


def test_bad_input(world):
    with pytest.raises(ValueError, match="theta"):
        world.pass_rates(np.zeros(world.dim + 1))
    with pytest.raises(ValueError, match="idx"):
        world.pass_rates(world.init_theta(), [world.n_prompts])
    with pytest.raises(ValueError, match="n"):
        world.sample(world.init_theta(), [0], -1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="normalise"):
        policy_gradient(world, world.init_theta(), world.sample(world.init_theta(), [0], 2, np.random.default_rng(0)),
                        normalise="token")


def test_adam_in_the_simulated_world_matches_torch_and_ignores_the_advantage_scale():
    """The simulated policy's ``adam`` is the trainer's optimizer: torch's AdamW (betas 0.9, 0.99, no
    weight decay) after clipping the global gradient norm; scaling every advantage by 10 leaves its
    first step unchanged (SGD's grows tenfold): the step-size artifact of issue #15 cannot arise."""
    torch = pytest.importorskip("torch")
    from rlcurate.sim.bridge import SimPolicy

    world = SoftmaxWorld.make(n_prompts=20, seed=3)
    theta0 = world.init_theta()
    rng = np.random.default_rng(0)
    grads = [rng.normal(0, s, theta0.shape) for s in (0.3, 2.0, 0.05, 5.0)]  # two above the clip of 1
    pol = SimPolicy(world, theta0, lr=0.01, optimizer="adam")
    t = torch.tensor(theta0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([t], lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    for g in grads:
        pol._step(g)
        opt.zero_grad()
        t.grad = -torch.tensor(g)  # torch descends; the policy ascends
        torch.nn.utils.clip_grad_norm_([t], 1.0)
        opt.step()
    np.testing.assert_allclose(pol.theta, t.detach().numpy(), rtol=1e-9, atol=1e-15)  # float order differs

    steps = {}
    for opt_name in ("adam", "sgd"):
        for scale in (1.0, 10.0):
            p = SimPolicy(world, theta0, lr=0.01, optimizer=opt_name, grad_clip=0.0)
            p._step(scale * grads[2])
            steps[opt_name, scale] = np.linalg.norm(p.theta - theta0)
    assert steps["adam", 10.0] == pytest.approx(steps["adam", 1.0], rel=1e-6)
    assert steps["sgd", 10.0] == pytest.approx(10 * steps["sgd", 1.0])


def test_the_simulated_validation_split_is_disjoint_and_leaves_the_old_splits_alone():
    from rlcurate.curation import build_curator
    from rlcurate.sim.bridge import SimTask, SimTrainer

    world = SoftmaxWorld.make(n_prompts=100, seed=1)
    old, new = SimTask(world, 0.2, seed=4), SimTask(world, 0.2, seed=4, validation_fraction=0.1)
    assert np.array_equal(old.prompt_ids("test"), new.prompt_ids("test"))
    assert len(old.prompt_ids("validation")) == 0 and len(new.prompt_ids("validation")) == 10
    ids = [set(new.prompt_ids(s)) for s in ("train", "test", "validation")]
    assert sum(map(len, ids)) == 100 and len(set().union(*ids)) == 100
    tr = SimTrainer(world, build_curator("uniform"), optimizer="adam", lr=0.05, validation_fraction=0.1, seed=4,
                    eval_split="validation", prompts_per_step=8, group_size=4)
    assert set(tr.test_ids) == ids[2]
    start = tr.held_out()
    assert tr.run(20).records[-1]["held_out"] > start  # Adam at this rate learns on the validation prompts
    with pytest.raises(ValueError, match="validation needs validation_fraction"):
        SimTrainer(world, build_curator("uniform"), eval_split="validation")
    with pytest.raises(ValueError, match="optimizer must be"):
        SimTrainer(world, build_curator("uniform"), optimizer="rmsprop")
    with pytest.raises(ValueError, match="must leave training prompts"):
        SimTask(world, 0.5, validation_fraction=0.5)
