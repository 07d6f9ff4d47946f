"""Reinforce-Ada-Seq and SAGE around verl 0.7.1's rollout manager (rlcurate.interop.verl_rollout, appendix A2):
verl's real ``DataProto`` and a stand-in for its agent-loop manager whose rewards are a fixed function of the
generation call, the row, the prompt and whether it was hinted, so the wrapper and this package's own strategy,
fed the same draws, must keep the same responses."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from rlcurate.curation import build_curator  # noqa: E402
from rlcurate.curation.base import Group  # noqa: E402
from rlcurate.interop.verl import POOL_ADV_ESTIMATOR  # noqa: E402
from rlcurate.interop.verl_rollout import CuratedRollout  # noqa: E402
from rlcurate.tasks import get_task  # noqa: E402

WIDTH = 4  # verl pads every response to data.max_response_length; rows of different calls concatenate


def reward_of(call: int, rows: int, rates: np.ndarray) -> np.ndarray:
    """The draws of one generation call: row j is right iff u(call, j) < its pass rate."""
    return (np.random.default_rng([11, call]).random(rows) < rates).astype(np.float32)


class Manager:
    """verl's agent-loop manager as fit() sees it: n rows in, n rows out, rm_scores on the last response token;
    ``row_id`` names each response (call * 1000 + row). A prompt's pass rate is ``rate[index]``, ``hinted[index]``
    when its raw_prompt is not the dataset's. With ``reward_loop`` (verl 0.7.1's default without a reward model:
    reward-loop workers write rm_scores) none of the input's non-tensor keys come back, as in verl's agent loop;
    without, all of them do."""

    def __init__(self, rate, hinted=None, plain=None, reward_loop=True):
        self.rate, self.hinted, self.plain, self.calls = rate, hinted or {}, plain or {}, 0
        self.validated, self.reward_loop = 0, reward_loop

    def generate_sequences(self, batch):
        if batch.meta_info.get("validate"):
            self.validated += 1
            return batch
        B, call = len(batch), self.calls
        self.calls += 1
        ids = [int(i) for i in batch.non_tensor_batch["index"]]
        raw = batch.non_tensor_batch["raw_prompt"]
        rates = np.array([self.hinted[i] if self.plain and raw[k] != self.plain[i] else self.rate[i]
                          for k, i in enumerate(ids)])
        r = torch.from_numpy(reward_of(call, B, rates))
        scores = torch.zeros(B, WIDTH)
        scores[:, -1] = r
        return DataProto.from_dict(
            tensors={"responses": torch.full((B, WIDTH), 7), "rm_scores": scores,
                     "row_id": torch.arange(B) + 1000 * call},
            non_tensors={"__num_turns__": np.full(B, 2, dtype=np.int32), **({} if self.reward_loop else {
                k: v.copy() for k, v in batch.non_tensor_batch.items()})},
            meta_info={"timing": {"gen": 1.0}, "global_steps": batch.meta_info.get("global_steps")})


def prompts(ids, n, raw):
    """A step's gen_batch as fit() hands it over: each prompt repeated n times, interleaved."""
    one = DataProto.from_dict(tensors={"input_ids": torch.arange(len(ids))[:, None].repeat(1, 3)},
                              non_tensors={"index": np.array(ids, dtype=object),
                                           "uid": np.array([f"u{i}" for i in ids], dtype=object),
                                           "raw_prompt": np.array([raw[i] for i in ids] + [None], dtype=object)[:-1]})
    return one.repeat(repeat_times=n, interleave=True)


def reference(curator, ids, n, rate, hinted=None, task=None, problems=None, calls=None):
    """This package's strategy on the same draws: its sampler and processors in a step context whose
    generate draws reward_of(call, ...) as the manager does. Returns the kept groups (completions:
    row ids)."""
    calls = calls if calls is not None else [0]

    def generate(indices, m, hints=None, hint_levels=None, hint_mode=None):
        hints = list(hints) if hints is not None else [None] * len(indices)
        levels = list(hint_levels) if hint_levels is not None else [0] * len(indices)
        rates = np.repeat([hinted[i] if h is not None else rate[i] for i, h in zip(indices, hints)], m)
        r = reward_of(calls[0], len(indices) * m, rates).astype(float)
        ref = [1000 * calls[0] + j for j in range(len(indices) * m)]
        calls[0] += 1
        return [Group(index=i, problem=problems[i] if problems else None, prompt=str(h or ""),
                      completions=ref[k * m:(k + 1) * m], rewards=r[k * m:(k + 1) * m], generated=m,
                      hint_level=int(lv)) for k, (i, h, lv) in enumerate(zip(indices, hints, levels))]

    ctx = SimpleNamespace(step=0, prompts_per_step=len(ids), group_size=n, generate=generate, task=task,
                          problems=problems, tokenizer=None, render=None)
    kept = curator.process(ctx, curator.sampler.rollout(ctx, ids))
    for part in [curator.sampler, *curator.processors]:
        part.observe(ctx, kept)
    return kept


@pytest.mark.parametrize("reward_loop", [True, False], ids=["reward_loop", "inputs_copied_back"])
def test_ada_seq_around_verls_manager_keeps_what_this_packages_ada_seq_keeps(reward_loop):
    """Rounds of 8 until each pool is balanced (at most 4), the released downsample to n = 4 rows per prompt in
    the prompts' order, (p_hat, N) per row for rlcurate_pool_grpo: the same responses, baselines and pool sizes as
    this package's ada_seq_balanced on the same draws; fit()'s union with the repeated prompts holds; a validation
    batch passes through."""
    n, ids = 4, [3, 0, 5, 2]
    rate = {0: 0.5, 2: 0.0, 3: 0.9, 5: 0.15}  # balanced at once, never, slowly (positives scarce), in a few rounds
    raw = {i: [{"role": "user", "content": f"q{i}"}] for i in rate}
    kwargs = {"round_repeat": 8, "max_rounds": 4}
    manager = Manager(rate, reward_loop=reward_loop)
    wrapped = CuratedRollout(manager, "ada_seq_balanced", n=n, strategy_kwargs=kwargs)
    batch = prompts(ids, n, raw)
    out = wrapped.generate_sequences(batch)
    kept = reference(build_curator("ada_seq_balanced", **kwargs), ids, n, rate)

    assert len(out) == n * len(ids) and manager.calls == wrapped.step_log[0]["calls"] > 1
    assert out.batch["row_id"].tolist() == [c for g in kept for c in g.completions]
    if not reward_loop:
        assert list(out.non_tensor_batch["index"]) == [i for i in ids for _ in range(n)]
    rb = out.batch["reward_baselines"].numpy()
    assert np.allclose(rb, [[g.baseline, g.pool_size] for g in kept for _ in range(n)])
    assert {g.pool_size for g in kept} != {8}  # some prompt needed more than one round
    assert np.allclose(out.batch["rm_scores"].sum(-1).numpy(), np.concatenate([g.rewards for g in kept]))
    assert out.meta_info["timing"]["gen"] == manager.calls  # summed over the calls
    # fit(): the popped batch (its reward keys) repeated n times unites with the output row for row
    keys = DataProto.from_dict(tensors={"dummy_tensor": torch.zeros(len(ids), 1, dtype=torch.uint8)},
                               non_tensors={"uid": np.array([f"u{i}" for i in ids], dtype=object)})
    united = keys.repeat(repeat_times=n, interleave=True).union(out)
    assert len(united) == len(out)
    # and the advantage verl computes from it is the pool estimator's
    adv, _ = core_algos.get_adv_estimator_fn(POOL_ADV_ESTIMATOR)(
        token_level_rewards=out.batch["rm_scores"], response_mask=torch.ones(len(out), WIDTH),
        index=united.non_tensor_batch["uid"], reward_baselines=out.batch["reward_baselines"])
    assert torch.isfinite(adv).all() and adv.abs().sum() > 0
    validation = prompts(ids, n, raw)
    validation.meta_info["validate"] = True
    assert wrapped.generate_sequences(validation) is validation and manager.validated == 1


@pytest.mark.parametrize("reward_loop", [True, False], ids=["reward_loop", "inputs_copied_back"])
def test_sage_light_around_verls_manager_hints_the_prompts_this_packages_sage_light_hints(reward_loop):
    """Three steps of SAGE-LIGHT with the task's own hints: a prompt that failed comes back hinted (its raw_prompt
    the task's chat turns with the hint), the levels per step and the kept responses equal this package's
    SAGE-LIGHT on the same draws, and each row says its level."""
    task = get_task("arithmetic", style="chat", levels=["add2", "mul2x1"], n_train=8, n_test=4)
    train = task.problems("train")
    ids = [0, 1, 2, 3]
    problems = {i: train[i] for i in ids}
    plain = {i: task.messages(problems[i]) for i in ids}
    rate = {0: 0.0, 1: 0.9, 2: 0.0, 3: 0.5}
    hinted = {0: 0.8, 1: 0.9, 2: 0.0, 3: 0.5}
    manager = Manager(rate, hinted, plain, reward_loop)
    wrapped = CuratedRollout(manager, "sage_light", n=4, strategy_kwargs={"hint_mode": "user"}, task=task,
                             problems=problems)
    own, calls = build_curator("sage_light", hint_mode="user"), [0]
    levels = []
    for step in range(3):
        batch = prompts(ids, 4, plain)
        batch.meta_info["global_steps"] = step
        out = wrapped.generate_sequences(batch)
        kept = reference(own, ids, 4, rate, hinted, task, problems, calls)
        assert out.batch["row_id"].tolist() == [c for g in kept for c in g.completions], step
        assert list(out.non_tensor_batch["hint_level"]) == [g.hint_level for g in kept for _ in range(4)], step
        levels.append([g.hint_level for g in kept])
        if not reward_loop:  # the raw_prompt the rows were generated from (the hinted draws above show it too)
            raw = out.non_tensor_batch["raw_prompt"]
            for k, g in enumerate(kept):
                assert (raw[4 * k] != plain[g.index]) == (g.hint_level > 0), (step, g.index)
    assert levels[0] == [0, 0, 0, 0] and levels[1][0] > 0 and levels[1][1] == 0  # the failed prompt comes back hinted
    assert "reward_baselines" not in out.batch.keys()


def test_what_cannot_run_around_verls_manager_is_refused_in_one_line():
    manager = Manager({0: 0.5})
    with pytest.raises(ValueError, match="changes how many rows a prompt trains on.*algorithm.filter_groups"):
        CuratedRollout(manager, "dapo", n=4)
    with pytest.raises(ValueError, match="prompts are chosen by the dataloader.*curriculum sampler"):
        CuratedRollout(manager, "insight", n=4)
    with pytest.raises(ValueError, match="round_repeat 2 < rollout.n 4"):
        CuratedRollout(manager, "ada_seq_balanced", n=4, strategy_kwargs={"round_repeat": 2})
    with pytest.raises(ValueError, match="correction='inverse_p'.*cannot reach the loss"):
        CuratedRollout(manager, "ada_seq_balanced", n=4, strategy_kwargs={"correction": "inverse_p"})
    with pytest.raises(ValueError, match="needs task= and problems="):
        CuratedRollout(manager, "sage_light", n=4)
    with pytest.raises(ValueError, match="needs each response's reward during the rounds"):
        bare = SimpleNamespace(generate_sequences=lambda b: DataProto.from_dict(
            tensors={"responses": torch.zeros(len(b), WIDTH)}, meta_info={}))
        CuratedRollout(bare, "ada_seq_balanced", n=4).generate_sequences(
            prompts([0], 4, {0: [{"role": "user", "content": "q"}]}))


def test_the_curriculum_sampler_reads_the_hint_level_the_wrapper_writes():
    """A selector in front of SAGE (verl's curriculum sampler): a prompt's hinted rows form their own group, and
    INSIGHT takes no evidence from it (hinted_evidence 'none', chapter 10), as in this package's trainer."""
    from omegaconf import OmegaConf

    from rlcurate.interop.verl import CurationSampler

    cfg = OmegaConf.create({"sampler": {"strategy": "insight", "group_size": 4, "seed": 0}, "train_batch_size": 2})
    sampler = CurationSampler(list(range(6)), cfg)
    scores = torch.zeros(12, WIDTH)
    scores[:, -1] = torch.tensor([1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 0], dtype=torch.float32)
    sampler.update(DataProto.from_dict(tensors={"token_level_scores": scores},
                                       non_tensors={"index": np.array([0] * 4 + [1] * 8, dtype=object),
                                                    "hint_level": np.array([0] * 8 + [2] * 4, dtype=object)}))
    beliefs = sampler.selection.selector.beliefs
    assert sampler.last_update == {0: (2, 4), 1: (0, 4)}
    assert (beliefs.alpha[:2].tolist(), beliefs.beta[:2].tolist()) == ([3.0, 1.0], [3.0, 5.0])  # 3 of 4 hinted: not counted


def _fit_batch(out, ids, n):
    """What fit() hands the curriculum sampler: the wrapper's output united with the step's prompts (their
    ``index``) and verl's token-level scores."""
    keys = DataProto.from_dict(tensors={"dummy_tensor": torch.zeros(len(ids), 1, dtype=torch.uint8)},
                               non_tensors={"index": np.array(ids, dtype=object)})
    united = keys.repeat(repeat_times=n, interleave=True).union(out)
    united.batch["token_level_scores"] = out.batch["rm_scores"]
    return united


@pytest.mark.parametrize("evidence", ["generated", "trained"])
def test_a_selector_in_front_of_the_wrapper_learns_from_what_was_generated(evidence):
    """INSIGHT as verl's curriculum sampler in front of Ada-Seq and of SAGE: its beliefs move by each prompt's whole
    unhinted pool (Ada-Seq: every round; SAGE: the level-0 group of a rescued prompt), as in this package's trainer,
    not by the kept rows (balanced Ada-Seq keeps n/2 positives whatever the pass rate)."""
    from omegaconf import OmegaConf

    from rlcurate.interop.verl import CurationSampler

    n, ids = 4, [3, 0, 5, 2]
    rate = {0: 0.5, 2: 0.0, 3: 0.9, 5: 0.15}
    raw = {i: [{"role": "user", "content": f"q{i}"}] for i in rate}
    kwargs = {"round_repeat": 8, "max_rounds": 4}
    out = CuratedRollout(Manager(rate), "ada_seq_balanced", n=n, strategy_kwargs=kwargs).generate_sequences(
        prompts(ids, n, raw))
    kept = reference(build_curator("ada_seq_balanced", **kwargs), ids, n, rate)
    cfg = OmegaConf.create({"sampler": {"strategy": "insight", "group_size": n, "seed": 0,
                                        "strategy_kwargs": {"evidence": evidence}}, "train_batch_size": 2})
    sampler = CurationSampler(list(range(6)), cfg)
    sampler.update(_fit_batch(out, ids, n))
    pools = {g.index: (int(g.pool_successes), g.pool_size) for g in kept}
    assert sampler.last_update == pools
    assert {s / k for s, k in pools.values()} != {0.5}  # the kept rows alone would say 1/2 for every prompt
    beliefs = sampler.selection.selector.beliefs
    for i, (s, k) in pools.items():
        assert (beliefs.alpha[i], beliefs.beta[i]) == (1 + s, 1 + k - s), i

    # SAGE: prompt 0 fails unhinted (level 0: 0 of 4) and is rescued by a hint; with hinted_evidence="failures"
    # the hinted failures count too when the generated groups are the evidence
    task = get_task("arithmetic", style="chat", levels=["add2", "mul2x1"], n_train=8, n_test=4)
    train = task.problems("train")
    problems = {i: train[i] for i in range(4)}
    plain = {i: task.messages(problems[i]) for i in problems}
    rate, hinted = {0: 0.0, 1: 0.5, 2: 0.5, 3: 0.5}, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}
    wrapped = CuratedRollout(Manager(rate, hinted, plain), "sage", n=n, strategy_kwargs={"hint_mode": "user"},
                             task=task, problems=problems)
    out = wrapped.generate_sequences(prompts([0, 1, 2, 3], n, plain))
    levels = out.non_tensor_batch["hint_level"].reshape(4, n)[:, 0]
    assert levels[0] > 0 and list(out.non_tensor_batch["pool_size"].reshape(4, n)[:, 0]) == [n, 0, 0, 0]
    cfg.sampler.strategy_kwargs = {"evidence": evidence, "hinted_evidence": "failures"}
    sampler = CurationSampler(list(range(6)), cfg)
    sampler.update(_fit_batch(out, [0, 1, 2, 3], n))
    hinted_failures = int((out.batch["rm_scores"].sum(-1)[:n] < 1).sum())
    a, b = sampler.selection.selector.beliefs.alpha[0], sampler.selection.selector.beliefs.beta[0]
    assert 0 < hinted_failures < n and sampler.last_update[0] == (0, n) and a == 1
    assert b == 1 + n + (hinted_failures if evidence == "generated" else 0)


def test_sage_lights_schedule_travels_in_the_curriculum_samplers_checkpoint():
    """verl 0.7 saves only the dataloader's state (data.pt): with ``curriculum=`` the wrapper's SAGE-LIGHT levels
    are part of the curriculum sampler's state, and a resumed run (sampler restored before or after the wrapper is
    attached) continues the schedule instead of starting every prompt at level 0."""
    from omegaconf import OmegaConf

    from rlcurate.interop.verl import CurationSampler

    task = get_task("arithmetic", style="chat", levels=["add2", "mul2x1"], n_train=8, n_test=4)
    train = task.problems("train")
    ids = [0, 1, 2, 3]
    problems = {i: train[i] for i in ids}
    plain = {i: task.messages(problems[i]) for i in ids}
    cfg = OmegaConf.create({"sampler": {"strategy": "uniform", "group_size": 4, "seed": 0}, "train_batch_size": 4})

    def wrapper(curriculum):
        return CuratedRollout(Manager({0: 0.0, 1: 0.9, 2: 0.0, 3: 0.5}, {0: 0.8, 1: 0.9, 2: 0.0, 3: 0.5}, plain),
                              "sage_light", n=4, strategy_kwargs={"hint_mode": "user"}, task=task, problems=problems,
                              curriculum=curriculum)

    sampler = CurationSampler(list(range(8)), cfg)
    first = wrapper(sampler)
    for step in range(2):
        batch = prompts(ids, 4, plain)
        batch.meta_info["global_steps"] = step
        first.generate_sequences(batch)
    schedule = first.curator.sampler.state_dict()
    assert any(level > 0 for _, level, _ in schedule["visits"])  # the failing prompts came back hinted
    state = json.loads(json.dumps(sampler.state_dict()))  # as data.pt holds it
    assert state["hosted"]["sampler"] == json.loads(json.dumps(schedule))
    for attach_first in (True, False):  # verl restores data.pt in fit(), after the wrapper is built; either order
        resumed = CurationSampler(list(range(8)), cfg)
        if attach_first:
            again = wrapper(resumed)
            resumed.load_state_dict(state)
        else:
            resumed.load_state_dict(state)
            again = wrapper(resumed)
        assert again.curator.sampler.state_dict() == schedule
