"""The plan behind ``data.sampler.skip_zero_advantage`` in verl's v1 trainer (appendix A2), without verl: which rows
to drop, the advantage factor that keeps the loss's normaliser, and what would make the update differ. verl's own
code runs it in tests/test_interop_verl_current.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlcurate.interop.verl_skip import (advantage_scale, inexact_settings, plan_skip, refuse_inexact, skip_requested,
                                        zero_advantage_in_verl)


def batch(groups: dict[str, list[float]], lengths=None, padding=0):
    keys, tags, scores, tokens = [], [], [], []
    for name, rewards in groups.items():
        for s, r in enumerate(rewards):
            keys.append(f"{name}_{s}_0")
            tags.append({})
            scores.append(r)
            tokens.append((lengths or {}).get(name, 10))
    for j in range(padding):
        keys.append(f"pad_{j}_0")
        tags.append({"is_padding": True})
        scores.append(0.0)
        tokens.append(0)
    return keys, tags, scores, tokens


def test_flat_groups_and_padding_are_dropped_and_lone_responses_kept():
    keys, tags, scores, tokens = batch({"flat0": [0, 0, 0], "flat1": [1, 1], "mixed": [1, 0, 1], "lone": [1]},
                                       lengths={"flat0": 5, "flat1": 7, "mixed": 11, "lone": 3}, padding=2)
    plan = plan_skip(keys, tags, scores, tokens)
    assert plan.flat_groups == ["flat0", "flat1"]
    assert [keys[r] for r in plan.keep] == ["mixed_0_0", "mixed_1_0", "mixed_2_0", "lone_0_0"]
    assert sorted(keys[r] for r in plan.drop) == sorted(["flat0_0_0", "flat0_1_0", "flat0_2_0", "flat1_0_0",
                                                         "flat1_1_0", "pad_0_0", "pad_1_0"])
    assert (plan.tokens_kept, plan.tokens_dense) == (3 * 11 + 3, 3 * 5 + 2 * 7 + 3 * 11 + 3)
    assert advantage_scale(plan, "token-mean") == pytest.approx(36 / 65)
    for mode in ("token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert advantage_scale(plan, mode) == 1.0  # these divide by nothing or by the nominal row count
    assert plan.metrics() == {"rlcurate/skip_groups": 2, "rlcurate/skip_rows": 7, "rlcurate/skip_inexact": 0.0,
                              "rlcurate/skip_loss_token_share": pytest.approx(1 - 36 / 65)}
    # more real rows than one mini-batch: the dense trainer steps several times on them, so nothing is dropped
    long = plan_skip(keys, tags, scores, tokens, mini_batch_rows=8)
    assert long.drop == [] and long.inexact and long.keep == list(range(len(keys)))
    assert plan_skip(keys, tags, scores, tokens, mini_batch_rows=9).drop == plan.drop  # nine real rows fit


def test_a_group_is_flat_where_verls_float32_grpo_gives_it_zero():
    assert zero_advantage_in_verl([1.0, 1.0]) and zero_advantage_in_verl([0.5] * 8) and zero_advantage_in_verl([0.0] * 3)
    assert not zero_advantage_in_verl([1.0]) and not zero_advantage_in_verl([1.0, 0.0])
    # eight scores of 0.3 average to 0.3 - 3e-8 in float32 and verl's GRPO gives each 0.029: the dense trainer
    # trains them, so they are kept
    assert not zero_advantage_in_verl([0.3] * 8) and not zero_advantage_in_verl([0.1] * 7)


def test_a_group_is_flat_by_its_sessions_last_outputs():
    # session 0 of "turns" has two outputs: the first carries another score, only the last counts (verl's GRPO)
    keys = ["turns_0_0", "turns_0_1", "turns_1_0", "other_0_0", "other_1_0"]
    plan = plan_skip(keys, [{}] * 5, [0.3, 1.0, 1.0, 0.0, 1.0], [4] * 5)
    assert plan.flat_groups == ["turns"] and [keys[r] for r in plan.keep] == ["other_0_0", "other_1_0"]


def test_when_no_group_has_signal_the_cheapest_is_kept():
    keys, tags, scores, tokens = batch({"a": [0, 0], "b": [1, 1], "c": [0, 0]}, lengths={"a": 9, "b": 4, "c": 6})
    plan = plan_skip(keys, tags, scores, tokens)
    assert [keys[r] for r in plan.keep] == ["b_0_0", "b_1_0"] and plan.flat_groups == ["a", "c"]
    assert plan_skip(*batch({}, padding=3)).drop == []  # padding alone: nothing to plan


def exact(**changes):
    cfg = OmegaConf.create({
        "data": {"train_batch_size": 64, "sampler": {"skip_zero_advantage": True}},
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False,
                      "rollout_correction": {"rollout_rs": None, "rollout_is_batch_normalize": False}},
        "actor_rollout_ref": {"actor": {"use_kl_loss": False, "entropy_coeff": 0, "ppo_epochs": 1,
                                        "ppo_mini_batch_size": 16, "loss_agg_mode": "token-mean",
                                        "loss_scale_factor": None, "policy_loss": {"loss_mode": "vanilla"}}},
        "trainer": {"v1": {"trainer_mode": "rlcurate_curated", "sync": {"parameter_sync_step": 4}}}})
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def test_the_settings_that_would_change_the_update_are_named():
    assert inexact_settings(exact()) == [] and skip_requested(exact())
    actor = "actor_rollout_ref.actor"
    for key, value, named in (("algorithm.adv_estimator", "rloo", "adv_estimator=rloo"),
                              ("algorithm.use_kl_in_reward", True, "use_kl_in_reward=True"),
                              (f"{actor}.use_kl_loss", True, "use_kl_loss=True"),
                              (f"{actor}.entropy_coeff", 0.001, "entropy_coeff=0.001"),
                              (f"{actor}.ppo_epochs", 2, "ppo_epochs=2"),
                              (f"{actor}.ppo_mini_batch_size", 8, "ppo_mini_batch_size=8"),
                              (f"{actor}.policy_loss.loss_mode", "clip_cov", "loss_mode=clip_cov"),
                              ("algorithm.rollout_correction.rollout_rs", "token", "rollout_rs=token"),
                              ("algorithm.rollout_correction.rollout_is_batch_normalize", True, "batch_normalize=True"),
                              (f"{actor}.loss_agg_mode", "seq-mean-token-sum-norm", "loss_scale_factor"),
                              ("critic.enable", True, "critic.enable=True"),
                              (f"{actor}.strategy", "megatron", "strategy=megatron")):
        problems = inexact_settings(exact(**{key: value}))
        assert len(problems) == 1 and named in problems[0], (key, problems)
    assert inexact_settings(exact(**{f"{actor}.policy_loss.loss_mode": "gspo"})) == []
    assert inexact_settings(exact(**{f"{actor}.loss_agg_mode": "seq-mean-token-sum-norm",
                                     f"{actor}.loss_scale_factor": 4096})) == []
    with pytest.raises(ValueError, match=r"^trainer: data.sampler.skip_zero_advantage=true .*ppo_epochs=3 "):
        refuse_inexact(exact(**{f"{actor}.ppo_epochs": 3}), "trainer")
    with pytest.raises(ValueError, match="expected true or false"):
        skip_requested(exact(**{"data.sampler.skip_zero_advantage": "yes"}))
    assert not skip_requested(OmegaConf.create({"data": {"sampler": {}}}))
