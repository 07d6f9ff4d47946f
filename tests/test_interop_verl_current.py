"""rlcurate's prompt selection in the current verl (0.9.1) through its registered-trainer hook (appendix A2, issue #32).

verl 0.9.1 cannot share a process with the book's environment (its hydra needs omegaconf 2.3 and antlr 4.9),
so ``make setup`` installs it into ``.venv/verl-0.9.1`` and these tests run ``tests/verl_current_probe.py``
once, in a subprocess with that folder first on ``PYTHONPATH`` and
``VERL_USE_EXTERNAL_MODULES=rlcurate.interop.verl_v1`` (how a run registers the trainer), then assert on the
JSON it prints. The probe uses verl's own registry, default config, ``_init_dataloader``, ``step`` and DAPO
filter; it stubs TransferQueue (a dict), the rollout and the GPU half of ``_step_once`` (see its docstring).
Only the trainer's data path runs: no Ray workers, no rollouts, no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VERL_CURRENT = REPO / ".venv" / "verl-0.9.1"
PROBE = REPO / "tests" / "verl_current_probe.py"


@pytest.fixture(scope="module")
def probe() -> dict:
    if not (VERL_CURRENT / "verl" / "trainer" / "ppo" / "v1").is_dir():
        pytest.fail(f"verl 0.9.1 is not installed in {VERL_CURRENT}: run `make setup` (make test does it)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(VERL_CURRENT), str(REPO / "src")]),
               VERL_USE_EXTERNAL_MODULES="rlcurate.interop.verl_v1", VERL_USE_EXTERNAL_PLUGINS="none",
               PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(REPO))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RLCURATE-JSON ")]
    assert proc.returncode == 0 and lines, f"probe failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RLCURATE-JSON "):])


def test_registered_trainer_is_found_by_name_and_subclasses_verls_sync_trainer(probe):
    reg = probe["registry"]
    assert reg["verl"] == "0.9.1"
    assert reg["is_ours"], "get_trainer_cls('rlcurate_curated') is not rlcurate.interop.verl_v1.CuratedPPOTrainer"
    assert reg["sync_class_is_parent"] and reg["is_ppo_trainer"] and reg["imported_by_verl"]
    # selected as rlcurate_curated, it runs as verl's sync mode (verl 0.9.1 tests for the literal name "sync")
    assert reg["mode_after_init"] == reg["config_mode"] == "sync"
    # verl's sync replay buffer, which reads the groups it clears before clearing them (DAPO's evictions)
    assert reg["replay_buffer"] == "EvidenceKeepingReplayBuffer"


def test_dataloader_is_verls_stateful_loader_with_the_curation_sampler(probe):
    dl = probe["dataloader"]
    for mode, loader_batch in (("plain", 4), ("dapo", 1)):  # DAPO: verl fetches one prompt at a time
        d = dl[mode]
        assert d["is_stateful"] and d["loader"] == "StatefulDataLoader", mode
        assert d["is_curation"] and d["sampler"] == "CurationSampler", mode
        assert d["strategy"] == "insight" and d["replay_buffer"] == "EvidenceKeepingReplayBuffer", mode
        assert d["loader_batch"] == loader_batch and d["prompts_per_selection"] == 4, mode
        assert d["same_dataset"] and d["steps_per_epoch"] == 6, mode
    # a checkpoint of verl's dataloader (data.pt) restores the beliefs and continues with the same prompts
    assert dl["resume"]["continues"] and dl["resume"]["alpha_restored"], dl["resume"]
    assert len(dl["resume"]["next"]) == 4


def test_verl_step_feeds_the_sampler_as_the_same_rewards_fed_directly(probe):
    up = probe["update"]
    # agreement: the prompts verl fetched are those a sampler fed the same rewards directly selects
    assert up["drawn"] == up["ref_drawn"] and len(up["drawn"]) == 4
    assert up["alpha_equal"] and up["beta_equal"]
    # the beliefs hold the responses verl trained on, one per session: padding rows and the first turn of a
    # two-turn session (which carries the same reward) are not counted
    assert up["alpha_minus_1"] == up["successes"] and up["trials"] == up["responses"] == 4 * 4 * 4
    assert up["observed"] == 4 and up["rounds_seen"] == [0, 1, 2, 3]  # no lag: each selection saw every earlier step
    assert all(n == 4 for _, n in up["last_update"].values()) and len(up["last_update"]) == 4
    assert up["metrics"] == ["rlcurate/belief_mean_observed", "rlcurate/prompts_observed"]


def test_the_pool_baseline_is_refused_when_the_trainer_is_built(probe):
    msg = probe["dataloader"]["pool_refused"]
    assert "cannot run algorithm.adv_estimator=rlcurate_pool_grpo" in msg and "reward_baselines" in msg
    assert "\n" not in msg


def test_insight_under_dapo_observes_the_groups_verls_filter_evicts(probe):
    """verl's own replay buffer classifies and evicts the flat groups (clearing them from TransferQueue before the
    step ends); the trainer's buffer reads them first, and INSIGHT observes them at the step's end with the trained
    ones under evidence="generated" (an evicted prompt no longer keeps its prior), and not under "trained"."""
    d = probe["dapo_evidence"]
    gen, tr = d["generated"], d["trained"]
    for run in (gen, tr):
        assert run["evicted"] > 0 and run["trained"] > 0 and run["cleared_left"] == 0
    assert gen["trials"] == gen["trained"] + gen["evicted"] == 3 * 4 * 4  # one per response, three steps
    assert gen["evicted_trials"] == gen["evicted"] and gen["evicted_alpha"] == gen["evicted_successes"] > 0
    assert tr["trials"] == tr["trained"] and tr["evicted_trials"] == 0
    # verl's refills (refill_fn, for the evicted groups) are chosen by INSIGHT's rule among the prompts the step has
    # not taken, as PromptSelection.more chooses them, not taken from the next step's selection: one per step
    assert gen["rounds"] == 3 and len(gen["refills"]) >= 2
    for r in gen["refills"]:
        assert r["refilled"] == r["expected"] and r["refilled"] and not set(r["refilled"]) & set(r["step_prompts"])


def test_a_custom_replay_buffer_keeps_the_evidence_or_is_warned_of(probe):
    """trainer.v1.sampler.custom_sampler: a subclass of verl's ReplayBuffer keeps its class's behaviour with the
    evidence of the groups it clears read first; a buffer that is not one is warned of, once, naming it and the
    selector, when the selector learns from rewards (not for uniform)."""
    d = probe["custom_sampler"]
    mine = d["MyBuffer insight"]
    assert mine["bases"] == ["EvidenceKeepingMyBuffer", "EvidenceKeeping", "MyBuffer"] and mine["keeps"]
    assert mine["read"] == [["u1_0_0", "u1_1_0"], [1007, 1007], [0.0, 1.0]] and not mine["warnings"]
    own = d["OwnBuffer insight"]
    assert own["class"] == "OwnBuffer" and not own["keeps"] and len(own["warnings"]) == 1
    assert "custom_sampler OwnBuffer is not a verl ReplayBuffer" in own["warnings"][0] and "insight" in own["warnings"][0]
    assert d["OwnBuffer uniform"]["warnings"] == []
    keeping = d["MyKeeping insight"]  # a user's subclass of the evidence-keeping buffer has its list too
    assert keeping["keeps"] and keeping["read"] == mine["read"] and not keeping["warnings"]
    own = d["BuildsItsOwn insight"]  # a trainer subclass that builds its own buffer: warned of, no error
    assert own["class"] == "OwnBuffer" and not own["keeps"] and len(own["warnings"]) == 1


def test_refills_past_the_whole_pool_start_a_new_pass_without_repeats(probe):
    """A step whose refills ask for more prompts than the pool has left takes the whole pool, then a new pass in
    which no prompt comes twice (each refill handed the selector the step's prompts again, undoing the new pass, and
    prompts repeated within it); INSIGHT's K stays rollout.n (it was learnt from the rows: 12 with a prompt taken
    three times), and every response is one trial."""
    d = probe["refills_past_the_pool"]
    assert d["rounds"] == 2 and d["group_size"] == d["responses"]
    for step in d["steps"]:
        assert len(step) == 4 + 7 + 7 + 7 + 3 * 4
        whole, again = step[:d["pool"]], step[d["pool"]:]
        assert sorted(whole) == list(range(d["pool"])) and len(set(again)) == len(again)
    assert d["trials"] == sum(len(step) for step in d["steps"]) * d["responses"]


def test_dapo_verls_filter_and_this_packages_keep_the_same_groups_but_two_kinds(probe):
    """verl 0.9.1's ReplayBuffer._dapo_filtered_keys (real; the TransferQueue read is stubbed to return the
    float32 rm_scores verl's agent loop writes) against this package's DapoFilter on identical rewards."""
    d = probe["dapo"]
    both = ["float32_step", "graded_mixed", "mixed", "negative_mixed", "one_right", "tiny_zero"]
    assert sorted(set(d["verl_kept"]) & set(d["rlcurate_kept"])) == both
    # 1. a group of one reward: verl keeps it (its rule needs more than one trajectory to evict), this package drops it
    assert sorted(set(d["verl_kept"]) - set(d["rlcurate_kept"])) == ["single", "single0"]
    # 2. rewards that differ below float32 resolution (1 and 1 + 1e-12): verl stores rm_scores in float32, where
    #    they are equal, and evicts the group; this package compares float64 rewards and keeps it. Rounded to
    #    float32 first, this package drops it too; 1e-12 against 0 survives float32 in both.
    assert sorted(set(d["rlcurate_kept"]) - set(d["verl_kept"])) == ["tiny"]
    assert d["rlcurate_kept_float32"] == both
    # uniform groups, graded ones included (0.1 x 3, 0.7 x 6), are evicted by verl, logged by their float32 value
    assert d["verl_evicted_values"] == {"1.0": 2, "-1.0": 1, "0.5": 1, "0.0": 1, "0.10000000149011612": 1,
                                        "0.699999988079071": 1}


def test_sage_light_in_verl_hints_the_prompts_this_packages_sage_light_hints(probe):
    """verl's ``step`` fetches the prompts, the trainer's ``_next_train_batch`` writes SAGE-LIGHT's hinted
    raw_prompts, a stand-in agent loop rewards each response by what its prompt says (a hint raises the pass
    rate), and ``_step_once`` observes. Against this package's selector and SageLightSampler fed the same
    rewards: the same prompts (hinted chat turns included) reach the agent loop, at the same levels, and both
    end in the same state, over ten steps, with verl fetching four prompts at a time and one at a time. The trainer
    is built by its own ``__init__`` (selected as ``rlcurate_curated``, running as verl's sync mode); verl's replay
    buffer, its DAPO filter and refills and the GPU half of ``_step_once`` do not run (stubbed)."""
    hints = probe["hints"]
    for mode, loader_batch in (("uniform", 4), ("insight_one_per_fetch", 1), ("insight_hinted_failures", 1)):
        h = hints[mode]
        assert h["sampler"] == "HintedCurationSampler" and h["loader_batch"] == loader_batch, mode
        assert h["same_prompts"], mode  # (prompt id, raw_prompt) per step, in order
        assert h["levels"] == h["ref_levels"] and len(h["levels"]) == 10, mode
        assert h["hinted_prompts"] >= 10, (mode, h["levels"])
        if mode != "insight_hinted_failures":  # levels rise to 2; counting hinted failures moves INSIGHT off them first
            assert any(2 in step for step in h["levels"]), (mode, h["levels"])
        assert h["schedule_equal"] and h["selection_equal"] and h["observed"] == 10, mode
        assert h["uids_left"] == 0, mode  # every submitted prompt's level was used and forgotten
        counts = [[step.get(f"rlcurate/sage_rolled_level{lv}") for lv in range(4)] for step in h["metrics"]]
        assert counts == [[step.count(lv) for lv in range(4)] for step in h["levels"]], mode
        assert h["state_has_hints"] and h["restored"], mode  # the schedule travels in data.pt
        assert 64 < h["longest_hinted_prompt"] <= 256, mode  # checked against rollout.prompt_length when built
    # INSIGHT takes no evidence from hinted groups by default: its trials are exactly the unhinted responses;
    # with hinted_evidence="failures" (appendix A2's example) a hinted group's failures are trials too
    ev = hints["insight_one_per_fetch"]["hinted_evidence"]
    assert ev["trials_equal_unhinted"] and ev["hinted_responses"] > 0
    ev = hints["insight_hinted_failures"]["hinted_evidence"]
    assert ev["trials_equal_unhinted_and_hinted_failures"] and ev["hinted_failures"] > 0
    assert not ev["trials_equal_unhinted"]


def test_sage_light_under_dapo_sees_the_groups_verls_filter_evicts(probe):
    """SAGE-LIGHT under DAPO's filter: the all-wrong groups verl's replay buffer evicts (and refills) reach the
    schedule, so a prompt whose unhinted group was all wrong comes back hinted; the levels of every fetch (the
    refills' included) and the final schedule equal this package's SAGE-LIGHT fed the same groups in the order of
    the fetches, among them prompts fetched twice in a step (refills past the whole pool) with other accuracies."""
    d = probe["hints_under_dapo"]
    assert d["levels_equal"] and d["schedule_equal"] and d["repeats_with_other_accuracy"] > 0
    assert max(d["fetches_per_step"]) > 1 and d["flat_then_hinted"] > 0 and d["hinted_groups"] > 0
    assert d["evicted_uids_left"] == 0 and d["cleared_left"] == 0


def test_sage_in_verl_refuses_what_it_cannot_host_when_the_trainer_is_built(probe):
    refused = probe["hints"]["refused"]
    assert "sync trainer submits each prompt to its agent loop once; use sage_light" in refused["sage"]
    assert "needs task=" in refused["no_task"]
    assert "hint_mode 'prefix' writes into the assistant turn" in refused["prefix"]
    assert "'gsm8k' has no hint() method" in refused["self_written"] and "hint_source: task" in refused["self_written"]
    assert "row 0 of the training set" in refused["not_task_prompts"] and "task.messages(problem)" in refused["not_task_prompts"]
    assert "has no extra_info['uid']" in refused["unknown_uid"]
    assert "use sage_light" in probe["hints"]["sage_refused_at_construction"]
    assert refused["with_dapo"] == ""  # hosted since the evicted groups reach the schedule (below)
    assert "over actor_rollout_ref.rollout.prompt_length=64" in refused["too_long"] and "hint level" in refused["too_long"]


def test_verl_v1_module_names_the_version_it_needs():
    """In this environment (verl 0.7.1, no TransferQueue) the module refuses to import, saying why."""
    with pytest.raises(ImportError, match=r"needs verl >= 0.8 .* tested with verl 0.9.1"):
        import rlcurate.interop.verl_v1  # noqa: F401


def test_skipping_zero_advantage_groups_in_verl_leaves_the_policy_gradient_unchanged(probe):
    """``data.sampler.skip_zero_advantage``: on verl's own _balance_batch, _compute_advantage and policy losses, the
    flat groups (0/1 and graded) leave the batch, the rest is padded back to one mini-batch with masked rows, and
    the gradient on every kept row equals the dense batch's (vanilla PPO and GSPO, four loss aggregations)."""
    sk = probe["skip"]
    assert sk["dropped_groups"] == ["all0", "all1", "graded_equal"]  # a lone response keeps its score as advantage
    assert sk["kept_groups"] == ["graded_mixed", "mixed", "one_right", "rounded_equal", "single"]
    assert sk["dropped_dense_advantage_max"] == 0.0  # verl's GRPO gives the dropped rows nothing on the dense batch
    assert sk["rounded_equal_dense_advantage"] > 0.01  # equal scores whose float32 mean rounds: verl trains them
    rows = sk["rows"]
    assert rows["dense"] == rows["skip"] == rows["nominal_rows"] == 40 and rows["skip_real"] == 20
    assert rows["skip_pads_masked"]  # verl's 128-token padding rows carry no loss token
    assert sk["tokens"]["kept"] < sk["tokens"]["dense"]
    m = sk["metrics"]
    assert m["rlcurate/skip_groups"] == 3 and m["rlcurate/skip_rows"] == 14 and m["rlcurate/skip_inexact"] == 0
    assert m["rlcurate/skip_loss_token_share"] == pytest.approx(1 - sk["tokens"]["kept"] / sk["tokens"]["dense"])
    # in tokens passed through the model, rows this short (10-16 tokens) cost more replaced by 128-token padding rows
    net = sk["net_token_share"]
    assert net["pad_len"] == [128] and net["metric"] == pytest.approx(net["expected"]) and net["metric"] < 0
    assert len(sk["gradients"]) == 8
    for case, g in sk["gradients"].items():
        assert g["kept_max_grad"] > 1e-3, case  # the kept rows do move the policy
        assert g["kept_max_diff"] <= 1e-6 * max(1.0, g["kept_max_grad"]), case
        assert g["dropped_dense_max_grad"] == 0.0, case
        assert g["loss_skip"] == pytest.approx(g["loss_dense"], rel=1e-5, abs=1e-7), case


def test_skipped_groups_are_still_evidence_and_leave_transfer_queue(probe):
    sk = probe["skip"]
    # the sampler saw every group, the dropped ones included, one response per session
    assert sk["step"]["observed"] == {"all0": [0, 4], "all1": [4, 4], "mixed": [2, 4], "one_right": [1, 4],
                                      "graded_equal": [0, 4], "graded_mixed": [0, 4], "single": [1, 1],
                                      "rounded_equal": [0, 6]}
    assert sk["skipped_waiting"] == sk["dropped_keys"]  # held until the step's end ...
    assert sk["step"]["cleared"] == sk["dropped_keys"] and not sk["step"]["left_in_store"]  # ... then cleared
    assert sk["step"]["waiting_after"] == 0
    # the dense trainer trains the flat groups (with zero advantage), so they are trained rows: under
    # evidence="trained" too the beliefs hold every response observed
    responses = sum(n for _, n in sk["step"]["observed"].values())
    assert sk["step"]["belief_trials"] == {"generated": responses, "trained": responses}


def test_a_batch_longer_than_one_mini_batch_is_trained_whole(probe):
    """More rows than ppo_mini_batch_size x rollout.n (sessions with several outputs): the dense trainer takes
    several optimizer steps on such a batch and fewer rows would take fewer, so nothing is dropped."""
    long = probe["skip"]["too_long"]
    assert long["all_kept"] and long["waiting"] == 0 and long["rows_out"] >= long["rows_in"]
    assert long["metrics"]["rlcurate/skip_inexact"] == 1 and long["metrics"]["rlcurate/skip_rows"] == 0


def test_skipping_is_refused_where_it_would_change_the_update(probe):
    sk = probe["skip"]
    assert sk["refused_defaults"].startswith("rlcurate_curated: data.sampler.skip_zero_advantage=true")
    assert "algorithm.adv_estimator=gae" in sk["refused_defaults"]
    assert "ppo_mini_batch_size=256" in sk["refused_defaults"] and "\n" not in sk["refused_defaults"]
    assert "use_kl_loss=True" in sk["refused_kl"] and "ppo_epochs=2" in sk["refused_kl"]
