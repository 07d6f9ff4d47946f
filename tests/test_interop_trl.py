"""rlcurate's prompt selection as a drop-in sampler for TRL's GRPOTrainer (appendix A2).

The sampler is checked against TRL's own ``RepeatSampler`` contract, then the tiny model is trained a
few steps with TRL and the INSIGHT sampler on this CPU: the beliefs must hold exactly the rewards TRL
scored, and the selection lag caused by the dataloader's look-ahead is measured.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import numpy as np
import torch
import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from rlcurate.interop._core import PromptSelection, resolve_selector  # noqa: E402
from rlcurate.interop.trl import CuratedGRPOTrainer, CurationSampler, selection_lag  # noqa: E402


# ---------------------------------------------------------------------------------------------- sampler
def _stream(sampler):
    return list(iter(sampler))


@pytest.mark.parametrize("strategy", ["insight", "mopps", "uniform", "expected_difficulty", "inverse_evidence"])
def test_sampler_follows_the_repeat_sampler_contract(strategy):
    G, k, R = 4, 3, 2
    sel = PromptSelection(strategy, n_items=20, group_size=G, seed=5)
    sampler = CurationSampler(sel, mini_repeat_count=G, batch_size=k, repeat_count=R)
    stream = _stream(sampler)
    assert len(stream) == len(sampler) == (20 // k) * k * G * R
    chunk_len = k * G * R
    for c in range(len(stream) // chunk_len):
        chunk = stream[c * chunk_len:(c + 1) * chunk_len]
        once = chunk[: k * G]
        # each prompt index num_generations times in a row; k distinct prompts; the chunk repeated R times
        prompts = once[::G]
        assert all(once[j * G:(j + 1) * G] == [prompts[j]] * G for j in range(k))
        assert len(set(prompts)) == k
        assert chunk == once * R


def test_every_rank_yields_the_same_stream_given_the_same_rewards():
    """Two samplers (two ranks) with the same seed that observe the same gathered rewards agree."""
    ranks = [PromptSelection("insight", n_items=30, group_size=4, seed=1) for _ in range(2)]
    rng = np.random.default_rng(0)
    for _ in range(6):
        picks = [sel.select(3) for sel in ranks]
        assert picks[0] == picks[1]
        idx = np.repeat(picks[0], 4)
        rewards = (rng.random(idx.size) < 0.5).astype(float)
        for sel in ranks:
            sel.observe(idx, rewards)
    assert np.array_equal(ranks[0].selector.beliefs.alpha, ranks[1].selector.beliefs.alpha)


def test_top_ups_draw_from_a_stream_of_their_own():
    """Each top-up (``more``) draws random numbers no other call draws: with the stream of the current round,
    a top-up and the next round's ``select`` shared them (MoPPS's Thompson draws and INSIGHT's candidate draws
    then picked the top-up's prompts again), and so did two top-ups of one step."""
    from rlcurate.curation.base import Selector

    class Spy(Selector):
        name = "spy"

        def __init__(self):
            super().__init__()
            self.draws = []

        def select(self, ctx, k):
            self.draws.append(("select", float(ctx.rng.random())))
            return super().select(ctx, k)

        def more(self, ctx, k):
            self.draws.append(("more", float(ctx.rng.random())))
            return super().more(ctx, k)

    def run():
        sel = PromptSelection(Spy(), n_items=60, group_size=4, seed=3)
        first = sel.select(4)
        sel.more(4, taken=first)
        sel.more(4)
        sel.select(4)
        return sel

    sel = run()
    values = [v for _, v in sel.selector.draws]
    assert [kind for kind, _ in sel.selector.draws] == ["select", "more", "more", "select"]
    assert len(set(values)) == 4, f"two calls drew the same random numbers: {sel.selector.draws}"
    assert run().selector.draws == sel.selector.draws  # and all of it is reproducible
    other = PromptSelection(Spy(), n_items=60, group_size=4, seed=3)
    other.load_state_dict(json.loads(json.dumps(sel.state_dict())))
    assert other.more_calls == sel.more_calls == 2


def test_observe_counts_successes_at_the_threshold_and_skips_nan():
    sel = PromptSelection("insight", n_items=5, group_size=4, seed=0)
    counts = sel.observe([2, 2, 2, 2, 4, 4], [1.0, 0.0, 1.0, float("nan"), 0.5, 1.0])
    assert counts == {2: (2, 3), 4: (1, 2)}
    b = sel.selector.beliefs
    assert b.alpha[2] == 3 and b.beta[2] == 2 and b.alpha[4] == 2 and b.beta[4] == 2
    state = json.loads(json.dumps(sel.state_dict()))
    other = PromptSelection("insight", n_items=5, group_size=4, seed=0)
    other.load_state_dict(state)
    assert np.array_equal(other.selector.beliefs.alpha, b.alpha) and other.observed == 1


def test_response_level_strategies_are_refused():
    for name in ["dapo", "ada_seq_balanced", "gvm", "sage", "dro", "insight+dapo"]:
        with pytest.raises(ValueError, match="acts on responses"):
            resolve_selector(name)
    with pytest.raises(ValueError, match="audit_file"):
        resolve_selector("prefilter")


def test_prefilter_sampler_draws_only_audited_mixed_prompts(tmp_path):
    audit = tmp_path / "mixed.jsonl"
    audit.write_text("".join(json.dumps({"uid": f"p{i}"}) + "\n" for i in (1, 4, 7, 8)))
    sel = PromptSelection("prefilter", n_items=10, group_size=2, uids=[f"p{i}" for i in range(10)],
                          audit_file=str(audit))
    stream = _stream(CurationSampler(sel, mini_repeat_count=2, batch_size=2, chunks_per_epoch=6))
    assert set(stream) == {1, 4, 7, 8}
    assert Counter(stream[:16]) == Counter({1: 4, 4: 4, 7: 4, 8: 4})  # epochs over the kept subset


# ---------------------------------------------------------------------------------------------- training
def coin(uid: str, text: str) -> float:
    """A deterministic fair coin per (prompt, completion text): mixed groups from a random model."""
    return float(hashlib.blake2b(f"{uid}\x00{text}".encode(), digest_size=8).digest()[0] & 1)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    return save_tiny(build_tiny_model(seed=0), build_tiny_tokenizer(), tmp_path_factory.mktemp("tiny") / "ckpt")


def _train(tmp_path, ckpt, *, steps, steps_per_generation=1, strategy="insight", resume=None, **extra):
    import warnings

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from rlcurate.tasks.arithmetic import ArithmeticTask

    warnings.filterwarnings("ignore", category=FutureWarning)
    tok = AutoTokenizer.from_pretrained(ckpt)
    task = ArithmeticTask(levels=["add2", "add3"], n_train=12, n_test=2, seed=0)
    problems = task.problems("train")
    ds = Dataset.from_dict({"prompt": [task.render(p, tok) for p in problems], "uid": [p.uid for p in problems]})
    scored: list[tuple[int, float]] = []  # every (prompt index, reward) TRL computed in training

    def reward(prompts, completions, uid, rlcurate_index, trainer_state=None, **kwargs):
        out = [coin(u, c) for u, c in zip(uid, completions)]
        scored.extend(zip(rlcurate_index, out))
        return out

    G, k = 4, 2
    cfg = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=G * k // steps_per_generation,
                     gradient_accumulation_steps=1, steps_per_generation=steps_per_generation,
                     num_generations=G, max_completion_length=6, learning_rate=1e-4, max_steps=steps, beta=0.0,
                     temperature=1.0, top_k=0, top_p=1.0, use_cpu=True, bf16=False, fp16=False, use_vllm=False,
                     report_to="none", logging_steps=1, disable_tqdm=True, seed=0,
                     gradient_checkpointing=False, **{"save_strategy": "no", **extra})
    trainer = CuratedGRPOTrainer(model=str(ckpt), reward_funcs=reward, args=cfg, train_dataset=ds,
                                 processing_class=tok, strategy=strategy)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, scored


@pytest.mark.slow
def test_trl_training_feeds_the_real_rewards_into_the_beliefs(tmp_path, tiny_checkpoint):
    trainer, scored = _train(tmp_path, tiny_checkpoint, steps=4)
    sel = trainer.curation
    b = sel.selector.beliefs
    # every generation batch was observed once, after TRL scored it
    assert sel.observed == 4 and len(scored) == 4 * 8
    # exact counts: alpha - 1 = successes and beta - 1 = failures TRL scored for each prompt
    succ, fail = Counter(), Counter()
    for i, r in scored:
        (succ if r >= 1 else fail)[int(i)] += 1
    assert np.array_equal(b.alpha - 1, np.array([succ[i] for i in range(sel.n_items)], dtype=float))
    assert np.array_equal(b.beta - 1, np.array([fail[i] for i in range(sel.n_items)], dtype=float))
    assert (b.alpha - 1).sum() + (b.beta - 1).sum() == len(scored)
    # the prompts TRL trained on are exactly the ones the strategy selected, each in groups of 4
    trained = [int(i) for i, _ in scored]
    selected = [i for h in sel.history for i in h["indices"]]
    assert trained == [i for i in selected[: len(trained) // 4] for _ in range(4)]
    # accelerate's one-batch look-ahead: selection r saw the rewards of batches 0..r-2
    assert selection_lag(sel.history[:4]) == [1, 1, 1]
    logged = [h for h in trainer.state.log_history if "curation/prompts_observed" in h]
    assert logged and logged[-1]["curation/prompts_observed"] > 0


@pytest.mark.slow
def test_no_selection_lag_when_a_generation_batch_outlasts_the_accumulation_window(tmp_path, tiny_checkpoint):
    """steps_per_generation = 2 > gradient_accumulation_steps = 1: the look-ahead fetches the second
    pass over the same chunk, so every selection has seen every earlier batch's rewards."""
    trainer, scored = _train(tmp_path, tiny_checkpoint, steps=6, steps_per_generation=2, strategy="mopps")
    sel = trainer.curation
    assert sel.observed == 3 and len(scored) == 3 * 8
    b = sel.selector.beliefs
    assert (b.alpha - 1).sum() == sum(r >= 1 for _, r in scored)
    assert (b.beta - 1).sum() == sum(r < 1 for _, r in scored)
    assert selection_lag(sel.history[:3]) == [0, 0]


_WORKER = r'''
import json, os, sys, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import test_interop_trl as T
from datasets import Dataset
from transformers import AutoTokenizer
from transformers.utils import logging as hl
hl.set_verbosity_error(); hl.disable_progress_bar()
from trl import GRPOConfig
from rlcurate.tasks.arithmetic import ArithmeticTask
from rlcurate.interop.trl import CuratedGRPOTrainer
ckpt, out = sys.argv[1], Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(ckpt)
task = ArithmeticTask(levels=["add2", "add3"], n_train=12, n_test=2, seed=0)
ps = task.problems("train")
ds = Dataset.from_dict({"prompt": [task.render(p, tok) for p in ps], "uid": [p.uid for p in ps]})
scored = []
def reward(prompts, completions, uid, rlcurate_index, **kw):
    r = [T.coin(u, c) for u, c in zip(uid, completions)]
    scored.extend(zip([int(i) for i in rlcurate_index], r))
    return r
cfg = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=4, num_generations=4,
                 max_completion_length=6, max_steps=4, beta=0.0, use_cpu=True, ddp_backend="gloo",
                 report_to="none", save_strategy="no", logging_steps=100, disable_tqdm=True,
                 gradient_checkpointing=False, top_k=0, seed=0)
tr = CuratedGRPOTrainer(model=ckpt, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                        strategy="insight")
tr.train()
b = tr.curation.selector.beliefs
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({
    "history": [h["indices"] for h in tr.curation.history], "alpha": b.alpha.tolist(), "beta": b.beta.tolist(),
    "scored": scored, "world": tr.accelerator.num_processes}))
'''


@pytest.mark.slow
def test_two_processes_gather_the_rewards_and_select_the_same_prompts(two_processes):
    """torchrun, two CPU processes (gloo): each rank scores different completions, yet both ranks
    observe all of them and keep choosing the same prompts."""
    tmp_path = two_processes
    r0, r1 = (json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r0["history"] == r1["history"] and r0["alpha"] == r1["alpha"] and r0["beta"] == r1["beta"]
    assert r0["scored"] and r1["scored"] and sorted(r0["scored"]) != sorted(r1["scored"])  # each rank scored its own
    succ, fail = Counter(), Counter()
    for i, r in r0["scored"] + r1["scored"]:
        (succ if r >= 1 else fail)[int(i)] += 1
    alpha, beta = np.array(r0["alpha"]), np.array(r0["beta"])  # both ranks' beliefs hold all of them
    assert np.array_equal(alpha - 1, [succ[i] for i in range(alpha.size)])
    assert np.array_equal(beta - 1, [fail[i] for i in range(beta.size)])



@pytest.mark.slow
def test_skip_zero_advantage_on_two_processes_moves_the_model_as_dense_training(two_processes):
    """rlcurate.interop.trl_skip under DDP (two CPU processes, gloo, fp32: GRPOConfig's default bf16 autocast rounds
    differently when the batch's shape changes): each process packs its own rows with signal into as many rows as
    the other needs, the step runs (TRL gathers per-row metrics: unequal rows would break it), the strategy observed
    every row either way, and the all-reduced SGD step equals the dense one's."""
    rec = {(skip, rank): torch.load(two_processes / f"skip{skip}_rank{rank}.pt") for skip in (0, 1) for rank in (0, 1)}
    for rank in (0, 1):
        dense, skipping = rec[0, rank], rec[1, rank]
        assert dense["rows"] == 16 and skipping["rows"] < 16
        assert dense["alpha"] == skipping["alpha"] and dense["beta"] == skipping["beta"]
        scale = max(float(d.abs().max()) for d in dense["moved"])
        assert scale > 0
        for a, b in zip(dense["moved"], skipping["moved"]):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale)
    assert rec[1, 0]["rows"] == rec[1, 1]["rows"]  # as many rows on each process
    share = rec[1, 0]["log"][0]["rlcurate/skip_rows"]  # over both processes
    assert share == pytest.approx(1 - (rec[1, 0]["rows"] + rec[1, 1]["rows"]) / 32)

@pytest.mark.slow
def test_sampler_state_is_saved_with_trl_checkpoints_and_restored(tmp_path, tiny_checkpoint):
    from rlcurate.interop.trl import SAMPLER_STATE_FILE

    first, scored = _train(tmp_path, tiny_checkpoint, steps=2, save_strategy="steps", save_steps=2)
    saved = tmp_path / "trl" / "checkpoint-2" / SAMPLER_STATE_FILE
    state = json.loads(saved.read_text())
    assert state["observed"] == 2 and state["rounds"] == first.curation.rounds
    resumed, more = _train(tmp_path, tiny_checkpoint, steps=3, resume=str(tmp_path / "trl" / "checkpoint-2"))
    b = resumed.curation.selector.beliefs
    assert resumed.curation.observed == 3
    # the resumed beliefs hold the first run's two batches plus the third one
    assert (b.alpha - 1).sum() + (b.beta - 1).sum() == len(scored) + len(more) == 3 * 8


@pytest.mark.slow
def test_a_run_resumed_within_a_generation_batch_trains_what_the_uninterrupted_run_trains(tmp_path, tiny_checkpoint):
    """With num_iterations=3 each generation batch is trained on three optimizer steps, so checkpoint-1 falls within
    one. The run resumed from it trains that batch's last iterations on the completions the first generated (TRL's
    buffer and micro-step count travel with the checkpoint) instead of skipping them, then generates, selects and
    moves the model as the uninterrupted run does; so does a run resumed again from its own checkpoint-2 (still
    within the first batch), and one resumed with ignore_data_skip=True (within the epoch)."""
    def resume(name, checkpoint, **extra):
        return _train(tmp_path / name, tiny_checkpoint, steps=6, num_iterations=3, resume=str(checkpoint), **extra)

    whole, scored = _train(tmp_path / "whole", tiny_checkpoint, steps=6, num_iterations=3, save_strategy="steps",
                           save_steps=1)
    assert whole.curation.observed == 2 and len(scored) == 2 * 8
    once = resume("once", tmp_path / "whole" / "trl" / "checkpoint-1", save_strategy="steps", save_steps=1)
    runs = [once, resume("twice", tmp_path / "once" / "trl" / "checkpoint-2"),
            resume("ignoring", tmp_path / "whole" / "trl" / "checkpoint-1", ignore_data_skip=True)]
    for resumed, more in runs:
        assert more == scored[8:]  # one generation, at step 3: the same prompts and rewards
        assert resumed.curation.observed == 2
        # the selections since the checkpoint, each with the batches it had observed (the in-flight one's lag is 0)
        assert resumed.curation.history == whole.curation.history[-len(resumed.curation.history):]
        assert min(selection_lag(resumed.curation.history)) >= 0
        assert np.array_equal(resumed.curation.selector.beliefs.alpha, whole.curation.selector.beliefs.alpha)
        for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_a_checkpoint_between_generation_batches_leaves_no_earlier_runs_buffer(tmp_path, tiny_checkpoint):
    """A run saving into a checkpoint folder an earlier run left (the same output_dir) between generation batches:
    the earlier run's TRL buffer file would make a resume train its completions; it is removed."""
    from rlcurate.interop.trl import GENERATION_STATE_FILE

    stale = tmp_path / "run" / "trl" / "checkpoint-1" / GENERATION_STATE_FILE.format(rank=0)
    stale.parent.mkdir(parents=True)
    torch.save({"step": 1, "buffer": ["an earlier run's"]}, stale)
    _train(tmp_path / "run", tiny_checkpoint, steps=1, save_strategy="steps", save_steps=1)
    assert (stale.parent / "rlcurate_sampler.json").is_file() and not stale.exists()


@pytest.mark.slow
def test_a_run_resumed_at_an_epoch_boundary_ignoring_the_data_skip_trains_what_the_uninterrupted_run_trains(
        tmp_path, tiny_checkpoint):
    """checkpoint-12 ends the first epoch (the sampler's 12 chunks, one per step). The loop restores the generators before it builds
    the next epoch's iterator, as the uninterrupted run draws that iterator's seed: restoring them again after the
    first fetch (what a resume within the epoch needs with ignore_data_skip=True) rewound that draw, and the run
    sampled other completions."""
    whole, scored = _train(tmp_path / "whole", tiny_checkpoint, steps=14, save_strategy="steps", save_steps=12)
    resumed, more = _train(tmp_path / "ignoring", tiny_checkpoint, steps=14, ignore_data_skip=True,
                           resume=str(tmp_path / "whole" / "trl" / "checkpoint-12"))
    assert resumed._curation_sampler.chunks_per_epoch == 12 and more == scored[12 * 8:]  # the second epoch's first two generations: the same prompts and rewards
    assert np.array_equal(resumed.curation.selector.beliefs.alpha, whole.curation.selector.beliefs.alpha)
    for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------- DAPO in TRL
ALWAYS_RIGHT = 2  # prompts whose index is a multiple of this always get reward 1: their groups are not mixed


def dapo_reward(uid, text, index) -> float:
    return 1.0 if int(index) % ALWAYS_RIGHT == 0 else coin(uid, text)


class Recording(CuratedGRPOTrainer):
    """Keeps every round's gathered (prompt index, reward) rows and every batch handed to training (tests only)."""

    def __init__(self, *args, **kwargs):
        self.rounds, self.batches = [], []
        super().__init__(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            from accelerate.utils import gather_object

            self.rounds.append((list(self._scored[0]), self._scored[1].tolist(), gather_object(list(prompts))))
        return out

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.batches.append({k: v.detach().cpu() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return batch


def _train_dapo(tmp_path, ckpt, *, steps, strategy="dapo", strategy_kwargs=None, cls=None, with_task=False, **extra):
    import warnings

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from rlcurate.tasks.arithmetic import ArithmeticTask

    warnings.filterwarnings("ignore", category=FutureWarning)
    tok = AutoTokenizer.from_pretrained(ckpt)
    task = ArithmeticTask(levels=["add2", "add3"], n_train=12, n_test=2, seed=0)
    problems = task.problems("train")
    ds = Dataset.from_dict({"prompt": [task.render(p, tok) for p in problems], "uid": [p.uid for p in problems]})

    def reward(prompts, completions, uid, rlcurate_index, **kwargs):
        return [dapo_reward(u, c, i) for u, c, i in zip(uid, completions, rlcurate_index)]

    G, k = 4, 2
    cfg = GRPOConfig(output_dir=str(tmp_path / "trl"), gradient_accumulation_steps=1,
                     num_generations=G, learning_rate=1e-4, max_steps=steps, beta=0.0,
                     temperature=1.0, top_k=0, top_p=1.0, use_cpu=True, bf16=False, fp16=False, use_vllm=False,
                     report_to="none", logging_steps=1, disable_tqdm=True, seed=0, gradient_checkpointing=False,
                     save_strategy="no",
                     **{"per_device_train_batch_size": G * k, "max_completion_length": 6, **extra})
    trainer = (cls or Recording)(model=str(ckpt), reward_funcs=reward, args=cfg, train_dataset=ds,
                                 processing_class=tok, strategy=strategy, strategy_kwargs=strategy_kwargs,
                                 task=task if with_task else None)
    trainer.train()
    return trainer


def rlcurate_on(strategy, rounds, B: int, G: int, task=None, problems=None, step: int = 0, **kwargs):
    """This package's strategy (its own sampler and processors; a name or a Curator that carries state across
    steps) fed the completions TRL generated and scored in ``rounds`` (one (prompt index per row, reward per row,
    prompt text per row) triple per TRL call): each ``generate`` of m completions of a prompt takes that prompt's
    next m / G recorded groups, whose prompt must be the one this package renders (with its hint);
    ``more_prompts(k)`` gives the prompts of the next k recorded groups not yet taken. Returns (generated groups,
    kept groups); the sampler and processors then observe the kept ones, as this package's step does."""
    from types import SimpleNamespace

    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Group
    from rlcurate.tasks.base import Problem

    stream = [(int(idx[k]), rewards[k:k + G], texts[k]) for idx, rewards, texts in rounds for k in range(0, len(idx), G)]

    def render(i, hint=None, hint_mode=None):
        kw = {} if hint_mode is None else {"hint_mode": hint_mode}
        return task.render(problems[i], tokenizer, hint=hint, **kw)

    def generate(indices, m, hints=None, hint_levels=None, hint_mode=None):
        out = []
        for a, i in enumerate(indices):
            r = []
            for _ in range(m // G):
                k = next(k for k, (j, _, _) in enumerate(stream) if j == int(i))
                _, rewards, text = stream.pop(k)
                if task is not None:
                    assert text == render(int(i), None if hints is None else hints[a], hint_mode)
                r += list(rewards)
            out.append(Group(index=int(i), problem=Problem(uid=str(i), question="", answer="") if problems is None
                             else problems[int(i)], prompt="", completions=[SimpleNamespace(token_ids=(0,)) for _ in r],
                             rewards=np.array(r), generated=len(r),
                             hint_level=0 if hint_levels is None else int(hint_levels[a])))
        return out

    tokenizer = kwargs.pop("tokenizer", None)
    curator = build_curator(strategy, **kwargs) if isinstance(strategy, str) else strategy
    ctx = SimpleNamespace(step=step, prompts_per_step=B, group_size=G, generate=generate, task=task,
                          problems=problems, tokenizer=tokenizer, render=render,
                          more_prompts=lambda k: [i for i, _, _ in stream[:k]])
    chunk = list(dict.fromkeys(int(i) for i in rounds[0][0][::G]))  # the first call: the chunk's first groups
    groups = curator.sampler.rollout(ctx, chunk)
    assert not stream, "TRL generated completions this package's strategy would not have"
    kept = curator.process(ctx, groups)
    for part in [curator.sampler, *curator.processors]:
        part.observe(ctx, kept)
    return groups, kept


@pytest.mark.slow
@pytest.mark.parametrize("cap", [5, 1])
def test_dapo_in_trl_keeps_the_groups_and_advantages_this_packages_dapo_keeps(tmp_path, tiny_checkpoint, cap):
    """TRL's own GRPOTrainer loop with DAPO's dynamic sampling (huggingface/trl#3708): fed the rounds TRL generated
    and scored, this package's DAPO keeps the same groups, and the advantages TRL trains on are this package's
    standardised advantages of those groups (TRL's eps 1e-4, the Bessel std; float32 against float64). At the cap
    (one generation batch) the batch is filled with unmixed groups that carry no token into the loss."""
    from rlcurate.stats.advantages import standardised

    trainer = _train_dapo(tmp_path, tiny_checkpoint, steps=4, strategy_kwargs={"max_num_gen_batches": cap})
    G, B = 4, 2
    assert len(trainer.step_log) == len(trainer.batches) == 4
    rounds = list(trainer.rounds)
    extra_rounds = filled = 0
    for log, batch in zip(trainer.step_log, trainer.batches):
        mine, rounds = rounds[:log["calls"]], rounds[log["calls"]:]
        extra_rounds += len(mine) - 1
        filled += log["filled_groups"]
        groups, kept = rlcurate_on("dapo", mine, B, G, max_num_gen_batches=cap)
        assert [(g.index, g.size) for g in groups] == [tuple(x) for x in log["generated"]]
        assert [g.index for g in kept] == log["kept"]
        assert all(g.index % ALWAYS_RIGHT for g in kept)  # the always-right prompts never reach training
        expected = np.concatenate([standardised(g.rewards, eps=1e-4) for g in kept] + [np.zeros(G)] * log["filled_groups"])
        assert batch["advantages"].shape == (B * G,)
        np.testing.assert_allclose(batch["advantages"].numpy(), expected, atol=2e-6)
        assert not batch["completion_mask"][len(kept) * G:].any()  # filled groups: no token in the loss
        assert float(batch["num_items_in_batch"]) == float(batch["completion_mask"].sum())
    assert not rounds
    logged = [h for h in trainer.state.log_history if "curation/dapo_gen_batches" in h]
    if cap > 1:  # some steps needed more than one generation batch
        assert extra_rounds > 0 and max(h["curation/dapo_gen_batches"] for h in logged) > 1
    else:  # and some steps at the cap found fewer than B mixed groups
        assert extra_rounds == 0 and filled > 0 and max(h["curation/filled_groups"] for h in logged) > 0


class RecordingTopUps(Recording):
    """Also keeps, for every top-up a hosted DAPO asks for, the prompts the selector gave, the candidates and
    scores its rule ranked, and the prompts the step had taken before."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.top_ups = []
        real = self.curation.more

        def more(k, taken=None):
            before = set(self.curation.selector._taken)
            out = real(k, taken)
            sel = self.curation.selector
            self.top_ups.append((out, sel.last_candidates.copy(), sel.last_scores.copy(), before))
            return out

        self.curation.more = more


@pytest.mark.slow
def test_insight_and_dapo_compose_in_trl(tmp_path, tiny_checkpoint):
    """'insight+dapo': INSIGHT chooses the generation batch and every top-up by its own rule among the prompts the
    step has not taken (as this package's step does; not the pool's epoch order), and observes every round of a
    step at once, after it."""
    from rlcurate.stats.beliefs import top_m

    trainer = _train_dapo(tmp_path, tiny_checkpoint, steps=3, strategy="insight+dapo", cls=RecordingTopUps,
                          strategy_kwargs={"max_num_gen_batches": 4})
    sel, G = trainer.curation, 4
    assert type(sel.selector).__name__ == "InsightSelector"
    assert sel.observed == len(trainer.step_log) == 3 < len(trainer.rounds)  # once per step, top-ups included
    b = sel.selector.beliefs
    assert (b.alpha - 1).sum() + (b.beta - 1).sum() == sum(len(r) for _, r, _ in trainer.rounds)
    rounds, top_ups = list(trainer.rounds), list(trainer.top_ups)
    assert top_ups  # some step needed more than one generation batch
    for log in trainer.step_log:
        mine, rounds = rounds[:log["calls"]], rounds[log["calls"]:]
        chunk = [int(i) for i in mine[0][0][::G]]
        taken = set(chunk)
        for idx, _, _ in mine[1:]:  # each top-up call generated the prompts the selector's rule gave
            out, candidates, scores, before = top_ups.pop(0)
            assert [int(i) for i in idx[::G]] == out
            assert before == taken and not taken & set(out)  # the step's prompts so far were left out
            assert out == [int(i) for i in candidates[top_m(scores, len(out))]]  # INSIGHT's best among its candidates
            taken |= set(out)
    assert not rounds and not top_ups


def test_trl_refuses_what_its_loop_cannot_host_before_loading_a_model():
    from rlcurate.interop.trl import hosted_parts

    selector, dapo = hosted_parts("insight+dapo", {"max_num_gen_batches": 3})
    assert selector.name == "insight" and dapo.sampler.max_num_gen_batches == 3
    selector, dro = hosted_parts("insight+dro", {"use_as": "token_weights"})
    assert selector.name == "insight" and [p.name for p in dro.processors] == ["dro"]
    for name in ["gvm", "insight+gvm"]:
        with pytest.raises(ValueError, match=re.escape(f"strategy '{name}' cannot run in TRL's GRPOTrainer: gvm "
                                                       f"needs")):
            hosted_parts(name)
    for name in ["dro_filter", "dro_filter+dro"]:  # the paper's query filter: its own rollouts before choosing
        with pytest.raises(ValueError, match=re.escape(f"strategy '{name}' cannot run in TRL's GRPOTrainer: its "
                                                       f"selector 'dro_filter' needs this package's trainer (it "
                                                       f"generates rollouts")):
            hosted_parts(name)


def test_trl_refuses_a_uid_the_task_lacks_before_loading_a_model(tmp_path):
    """The model path does not exist: the uid is refused first, naming the column and the uid."""
    import datasets

    from rlcurate.interop.trl import CuratedGRPOTrainer
    from rlcurate.tasks import get_task

    from trl import GRPOConfig

    task = get_task("arithmetic", style="chat", levels=["add2"], n_train=4, n_test=2)
    rows = [{"prompt": "x", "uid": p.uid} for p in task.problems("train")] + [{"prompt": "y", "uid": "add:no-such"}]
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2,
                     per_device_train_batch_size=2)
    with pytest.raises(ValueError, match=re.escape("the training dataset's column 'uid': uid 'add:no-such' (1 of 5 "
                                                   "missing) is not a problem of task")):
        CuratedGRPOTrainer(model=str(tmp_path / "no-model-here"), reward_funcs=lambda **kw: [0.0], args=cfg,
                           train_dataset=datasets.Dataset.from_list(rows), strategy="sage_light",
                           strategy_kwargs={"hint_mode": "user"}, task=task)


_DAPO_WORKER = r'''
# runs after _WORKER in the same launch (its imports, tokenizer and dataset)
def reward(prompts, completions, uid, rlcurate_index, **kw):
    return [T.dapo_reward(u, c, i) for u, c, i in zip(uid, completions, rlcurate_index)]
# 6 rows per process, 4 per group: the second group of every generation batch spans the two processes
cfg = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=6, num_generations=4,
                 max_completion_length=6, max_steps=3, beta=0.0, use_cpu=True, ddp_backend="gloo",
                 report_to="none", save_strategy="no", logging_steps=100, disable_tqdm=True,
                 gradient_checkpointing=False, top_k=0, seed=0)
tr = T.Recording(model=ckpt, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                 strategy="dapo", strategy_kwargs={"max_num_gen_batches": 5})
tr.train()
(out / f"dapo_rank{os.environ['RANK']}.json").write_text(json.dumps({
    "log": tr.step_log, "rounds": tr.rounds, "world": tr.accelerator.num_processes,
    "batches": [{"advantages": b["advantages"].tolist(), "tokens": b["completion_mask"].sum(1).tolist(),
                 "items": float(b["num_items_in_batch"])} for b in tr.batches]}))
'''


_SKIP_WORKER = r"""
# runs after _WORKER in the same launch: one SGD step (lr 1: the step is the gradient) of INSIGHT with and without
# skip_zero_advantage; 16 rows per process in two micro-batches of 8
import torch
class Counting(CuratedGRPOTrainer):
    def _compute_loss(self, model, inputs):
        self.rows_trained = getattr(self, "rows_trained", 0) + len(inputs["advantages"])
        return super()._compute_loss(model, inputs)
def reward(prompts, completions, uid, rlcurate_index, **kw):
    return [T.dapo_reward(u, c, i) for u, c, i in zip(uid, completions, rlcurate_index)]
for skip in (False, True):
    cfg = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=8, num_generations=4,
                     gradient_accumulation_steps=2, steps_per_generation=2, loss_type="grpo",
                     max_completion_length=6, max_steps=1, beta=0.0, use_cpu=True, ddp_backend="gloo",
                     report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, optim="sgd",
                     learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=0.0, bf16=False,
                     gradient_checkpointing=False, top_k=0, seed=0)
    tr = Counting(model=ckpt, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                  strategy="insight", skip_zero_advantage=skip)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    b = tr.curation.selector.beliefs
    torch.save({"moved": [p.detach() - q for p, q in zip(tr.model.parameters(), before)],
                "rows": tr.rows_trained, "alpha": b.alpha.tolist(), "beta": b.beta.tolist(),
                "log": [h for h in tr.state.log_history if "rlcurate/skip_rows" in h]},
               out / f"skip{int(skip)}_rank{os.environ['RANK']}.pt")
"""

def _torchrun(tmp_path, script: str, ckpt) -> None:
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not found next to the interpreter")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                           "--master_port", str(port), str(worker), str(ckpt), str(tmp_path),
                           str(Path(__file__).parent)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_dapo_in_trl_on_two_processes_keeps_whole_groups_that_span_them(two_processes):
    """torchrun, two CPU processes, 6 rows each in groups of 4: both ranks take the same decisions, and the rows
    they train on, read rank 0 then rank 1, are this package's DAPO's kept groups with their advantages, each
    group whole although its rows were generated on two processes."""
    from rlcurate.stats.advantages import standardised

    tmp_path = two_processes
    r0, r1 = (json.loads((tmp_path / f"dapo_rank{k}.json").read_text()) for k in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r0["log"] == r1["log"] and r0["rounds"] == r1["rounds"]  # the same decisions from the gathered rewards
    G, B = 4, 3
    rounds, spanning = [tuple(r) for r in r0["rounds"]], 0
    for log, b0, b1 in zip(r0["log"], r0["batches"], r1["batches"]):
        mine, rounds = rounds[:log["calls"]], rounds[log["calls"]:]
        groups, kept = rlcurate_on("dapo", mine, B, G, max_num_gen_batches=5)
        assert [g.index for g in kept] == log["kept"]
        positions = [k for k, g in enumerate(groups) if g.mixed][:B]
        spanning += any(k % B == 1 for k in positions)  # a kept group generated across the two processes
        expected = np.concatenate([standardised(g.rewards, eps=1e-4) for g in kept] + [np.zeros(G)] * log["filled_groups"])
        assert len(b0["advantages"]) == len(b1["advantages"]) == 6
        np.testing.assert_allclose(b0["advantages"] + b1["advantages"], expected, atol=2e-6)
        assert b0["items"] == b1["items"] == sum(b0["tokens"]) + sum(b1["tokens"])  # the global token count
    assert not rounds and spanning > 0


@pytest.mark.slow
def test_ada_seq_in_trl_keeps_the_rows_and_advantages_this_packages_ada_seq_keeps(tmp_path, tiny_checkpoint,
                                                                                 round_repeat=8):
    """Reinforce-Ada-Seq (balanced exit) hosted in TRL's loop: rounds of round_repeat = 8 completions per prompt still
    active (two whole groups of num_generations = 4, the released script's setting),
    the balanced downsample to 4 and the pool baseline p_hat (scale_rewards 'none': Dr. GRPO's r - p_hat, the
    released script's setting). Fed the same completions, this package's Ada-Seq keeps the same rows with the
    same advantages; the always-right prompts stay to the last round."""
    from rlcurate.curation.base import group_advantages

    kw = {"max_rounds": 3, "round_repeat": round_repeat}
    trainer = _train_dapo(tmp_path, tiny_checkpoint, steps=3, strategy="ada_seq_balanced", strategy_kwargs=kw,
                          scale_rewards="none")
    G, B = 4, 2
    rounds = list(trainer.rounds)
    most = 0
    for log, batch in zip(trainer.step_log, trainer.batches):
        mine, rounds = rounds[:log["calls"]], rounds[log["calls"]:]
        groups, kept = rlcurate_on("ada_seq_balanced", mine, B, G, **kw)
        assert [(g.index, g.size) for g in groups] == [tuple(x) for x in log["generated"]]
        assert [g.index for g in kept] == log["kept"] and all(g.size == G for g in kept)
        most = max(most, max(g.size for g in groups))
        expected = np.concatenate([group_advantages(g, "drgrpo", 1e-4) for g in kept])
        np.testing.assert_allclose(batch["advantages"].numpy(), expected, atol=1e-6)
        assert batch["completion_mask"].shape[0] == B * G
    assert not rounds
    assert most == 3 * round_repeat  # a prompt that never met the exit rule ran every round
    logged = [h for h in trainer.state.log_history if "curation/ada_rounds" in h]
    assert logged and max(h["curation/ada_rounds"] for h in logged) == 3


def test_trl_refuses_ada_seq_rounds_that_are_not_whole_groups(tmp_path, tiny_checkpoint):
    with pytest.raises(ValueError, match="round_repeat 6 is not a multiple of num_generations 4"):
        _train_dapo(tmp_path, tiny_checkpoint, steps=1, strategy="ada_seq_balanced",
                    strategy_kwargs={"round_repeat": 6})


def _sage_trainer(tmp_path, ckpt, *, steps, strategy="sage_light", task=True, resume=None, **extra):
    """The tiny arithmetic task with 6 training prompts (revisited every 3 steps of 2 prompts); the reward is a
    coin, except that every third prompt always fails unhinted."""
    import warnings

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from rlcurate.tasks.arithmetic import ArithmeticTask

    warnings.filterwarnings("ignore", category=FutureWarning)
    tok = AutoTokenizer.from_pretrained(ckpt)
    arithmetic = ArithmeticTask(levels=["add2", "add3"], n_train=3, n_test=2, seed=0)
    problems = arithmetic.problems("train")
    plain = {p.uid: arithmetic.render(p, tok) for p in problems}
    ds = Dataset.from_dict({"prompt": list(plain.values()), "uid": list(plain)})

    def reward(prompts, completions, uid, rlcurate_index, **kwargs):
        return [0.0 if int(i) % 3 == 0 and prompt == plain[u] else coin(u, c)
                for prompt, u, c, i in zip(prompts, uid, completions, rlcurate_index)]

    cfg = GRPOConfig(output_dir=str(tmp_path / "trl"), num_generations=4, max_completion_length=6, learning_rate=1e-4,
                     max_steps=steps, beta=0.0, top_k=0, use_cpu=True, report_to="none", logging_steps=1,
                     disable_tqdm=True, seed=0, gradient_checkpointing=False,
                     **{"per_device_train_batch_size": 8, "save_strategy": "no", **extra})
    trainer = Recording(model=str(ckpt), reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                        strategy=strategy, task=arithmetic if task else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, arithmetic, problems, tok


@pytest.mark.slow
def test_sage_light_in_trl_hints_the_prompts_this_packages_sage_light_hints(tmp_path, tiny_checkpoint):
    """SAGE-LIGHT hosted in TRL's loop (chapter 7): a prompt whose group failed is hinted at its next visit, the
    hinted prompt (the task's rendering with the hint) is what TRL generates from and trains on, and the hint levels
    carried from step to step are those of this package's SAGE-LIGHT fed the same completions."""
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import group_advantages

    trainer, task, problems, tok = _sage_trainer(tmp_path, tiny_checkpoint, steps=6)
    G, B = 4, 2
    ours = build_curator("sage_light")
    rounds, hinted = list(trainer.rounds), 0
    for step, (log, batch) in enumerate(zip(trainer.step_log, trainer.batches)):
        mine, rounds = rounds[:log["calls"]], rounds[log["calls"]:]
        groups, kept = rlcurate_on(ours, mine, B, G, task=task, problems=problems, tokenizer=tok, step=step)
        assert [g.index for g in kept] == log["kept"] and [g.hint_level for g in kept] == log["hint_levels"]
        hinted += sum(g.hint_level > 0 for g in kept)
        expected = np.concatenate([group_advantages(g, "grpo", 1e-4) for g in kept])
        np.testing.assert_allclose(batch["advantages"].numpy(), expected, atol=2e-6)
    assert not rounds and hinted > 0  # the always-failing prompts came back hinted
    assert ours.sampler.state_dict() == trainer.curator.sampler.state_dict()


@pytest.mark.slow
def test_a_hosted_strategys_state_is_saved_with_trl_checkpoints_and_restored(tmp_path, tiny_checkpoint):
    """SAGE-LIGHT's hint levels travel with a TRL checkpoint (rlcurate_curator.json) beside the selector's state: a
    run resumed from step 2 trains steps 3 to 6 as the uninterrupted run does (the chunk the dataloader chose ahead
    before the checkpoint included; the epoch of 3 steps ends after step 3), and a prompt that failed in the first
    pass is hinted in the second. Dataloader workers are refused in one line."""
    from rlcurate.interop.trl import CURATOR_STATE_FILE

    whole, *_ = _sage_trainer(tmp_path, tiny_checkpoint, steps=6, save_strategy="steps", save_steps=2)
    saved = tmp_path / "trl" / "checkpoint-2"
    at_2 = json.loads((saved / CURATOR_STATE_FILE).read_text())["sampler"]
    assert any(acc == 0 for _, _, acc in at_2["visits"])  # a prompt that failed: hinted at its next visit
    resumed, *_ = _sage_trainer(tmp_path / "again", tiny_checkpoint, steps=6, resume=str(saved))
    end = whole.curator.sampler.state_dict()
    assert any(lv > 0 for _, lv, _ in end["visits"])  # the second pass hinted a prompt that failed in the first
    # steps 3 to 6 train the same prompts at the same hint levels with the same rewards (the generators are
    # restored after the dataloader's iterator drew its seed), so the levels and accuracies end the same
    assert resumed.curator.sampler.state_dict() == end
    plan = lambda log: [(s["kept"], s["hint_levels"]) for s in log]  # noqa: E731
    assert plan(resumed.step_log) == plan(whole.step_log[2:])
    assert resumed.rounds == whole.rounds[-len(resumed.rounds):]  # every call's prompt indices, rewards and texts
    with pytest.raises(ValueError, match="dataloader_num_workers=1: worker processes would choose prompts"):
        _sage_trainer(tmp_path, tiny_checkpoint, steps=1, dataloader_num_workers=1)


def test_sage_in_trl_is_refused_without_the_task_that_writes_its_hints(tmp_path, tiny_checkpoint):
    with pytest.raises(ValueError, match="needs task="):
        _sage_trainer(tmp_path, tiny_checkpoint, steps=1, task=False)


_SAGE_WORKER = r'''
import json, os, sys, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import test_interop_trl as T
from transformers.utils import logging as hl
hl.set_verbosity_error(); hl.disable_progress_bar()
out = Path(sys.argv[2])
# 6 rows per process, groups of 4: the second prompt's group spans the two processes
tr, task, problems, tok = T._sage_trainer(out, sys.argv[1], steps=6, per_device_train_batch_size=6,
                                          ddp_backend="gloo")
(out / f"sage_rank{os.environ['RANK']}.json").write_text(json.dumps({
    "log": tr.step_log, "rounds": tr.rounds, "state": tr.curator.sampler.state_dict(),
    "world": tr.accelerator.num_processes, "advantages": [b["advantages"].tolist() for b in tr.batches]}))
'''


@pytest.mark.slow
def test_sage_light_in_trl_on_two_processes_keeps_one_schedule(two_processes, tiny_checkpoint):
    """SAGE-LIGHT keeps state (each prompt's hint level): on two processes both ranks carry the same levels,
    hint the same prompts, and train, rank 0 then rank 1, on this package's groups with its advantages."""
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import group_advantages
    from rlcurate.tasks.arithmetic import ArithmeticTask
    from transformers import AutoTokenizer

    tmp_path = two_processes
    r0, r1 = (json.loads((tmp_path / f"sage_rank{k}.json").read_text()) for k in (0, 1))
    assert r0["world"] == 2 and r0["log"] == r1["log"] and r0["state"] == r1["state"]
    task = ArithmeticTask(levels=["add2", "add3"], n_train=3, n_test=2, seed=0)
    problems, tok = task.problems("train"), AutoTokenizer.from_pretrained(tiny_checkpoint)
    ours, G, B = build_curator("sage_light"), 4, 3
    rounds, hinted = [tuple(r) for r in r0["rounds"]], 0
    for step, (log, a0, a1) in enumerate(zip(r0["log"], r0["advantages"], r1["advantages"])):
        mine, rounds = rounds[:log["calls"]], rounds[log["calls"]:]
        _, kept = rlcurate_on(ours, mine, B, G, task=task, problems=problems, tokenizer=tok, step=step)
        assert [g.index for g in kept] == log["kept"] and [g.hint_level for g in kept] == log["hint_levels"]
        hinted += sum(g.hint_level > 0 for g in kept)
        expected = np.concatenate([group_advantages(g, "grpo", 1e-4) for g in kept])
        np.testing.assert_allclose(a0 + a1, expected, atol=2e-6)
    assert not rounds and hinted > 0
    assert ours.sampler.state_dict() == r0["state"]


_DRO_WORKER = r'''
# 6 rows per process, groups of 4: the second prompt's group spans the two processes. Each rank rebuilds this
# package's DRO on the gathered completions and the model it had (T._dro_in_trl) and checks its own share of the
# training batch against it.
import numpy as np
tr, steps = T._dro_in_trl(out / "dro", sys.argv[1], "dro", {"use_as": "both"}, loss_type="dapo",
                          per_device_train_batch_size=6, ddp_backend="gloo")
rank, share = tr.accelerator.process_index, 6
diff, weighted, rows = 0.0, 0, 0
for (kept, advantages, model), batch in zip(steps, tr.batches):
    expected = T._per_token_advantages(kept, advantages)[rank * share:(rank + 1) * share]
    comps = [c for g in kept for c in g.completions][rank * share:(rank + 1) * share]
    for r, (e, c) in enumerate(zip(expected, comps)):
        n = len(c.token_ids)
        assert batch["completion_ids"][r, :n].tolist() == list(c.token_ids)
        diff = max(diff, float(abs(batch["advantages"][r, :n].numpy() - e).max()))
        rows += 1
    weighted += sum(int((np.asarray(w) != 1).any() and a != 0)  # a weighted token with a gradient, in all rows
                    for g, adv in zip(kept, advantages) for w, a in zip(g.token_weights, adv))
(out / f"dro_rank{os.environ['RANK']}.json").write_text(json.dumps({
    "log": tr.step_log, "world": tr.accelerator.num_processes, "diff": diff, "weighted": weighted, "rows": rows}))
'''


@pytest.mark.slow
def test_dro_in_trl_on_two_processes_weights_the_tokens_as_this_packages_dro(two_processes):
    """DRO's scoring pass and the completions' token ids are gathered across processes: on two ranks, with a group
    that spans them, both take the same decisions and each trains its share of the rows with this package's A w."""
    r0, r1 = (json.loads((two_processes / f"dro_rank{k}.json").read_text()) for k in (0, 1))
    assert r0["world"] == 2 and r0["log"] == r1["log"]
    assert r0["rows"] == r1["rows"] == 12  # 6 rows a rank, two steps
    assert r0["diff"] < 1e-6 and r1["diff"] < 1e-6
    assert r0["weighted"] == r1["weighted"] > 0  # some completions' answer spans are weighted (seen alike by both)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, tiny_checkpoint):
    """One torchrun launch (two CPU processes, gloo) that trains INSIGHT, DAPO, SAGE-LIGHT, DRO and the skip in turn and
    leaves each rank's record in the folder it returns (one launch: the processes' start-up is paid once)."""
    folder = tmp_path_factory.mktemp("two_processes")
    _torchrun(folder, _WORKER + _DAPO_WORKER + _SAGE_WORKER + _DRO_WORKER + _SKIP_WORKER, tiny_checkpoint)
    return folder


@pytest.mark.slow
def test_hosted_strategies_follow_trls_generation_batches_and_iterations(tmp_path, tiny_checkpoint):
    """A hosted strategy runs once per TRL generation batch: with steps_per_generation = 2, four optimizer steps
    are two DAPO steps whose batches TRL splits in two; with num_iterations = 2 (Ada-Seq), the rows carry the
    old log-probabilities of their own generation call into both passes."""
    dapo = _train_dapo(tmp_path, tiny_checkpoint, steps=4, strategy_kwargs={"max_num_gen_batches": 4},
                       steps_per_generation=2, per_device_train_batch_size=4)
    assert len(dapo.step_log) == 2 and all(b["advantages"].shape == (8,) for b in dapo.batches)
    ada = _train_dapo(tmp_path / "ada", tiny_checkpoint, steps=2, strategy="ada_seq_balanced",
                      strategy_kwargs={"round_repeat": 8, "max_rounds": 2}, num_iterations=2, scale_rewards="none")
    assert len(ada.step_log) == 1
    batch = ada.batches[0]
    assert batch["old_per_token_logps"].shape == batch["completion_ids"].shape
    assert torch.isfinite(batch["old_per_token_logps"][batch["completion_mask"].bool()]).all()


# ---------------------------------------------------------------------------------------------- DRO in TRL
class DroRecording(Recording):
    """Also keeps, per TRL generation call, the prompt and completion token ids TRL generated, and per step the
    model's weights at the step's start (what DRO scored with and what the step's loss differentiates)."""

    def __init__(self, *args, **kwargs):
        self.generated, self.snapshots = [], []
        super().__init__(*args, **kwargs)

    def _generate(self, prompts):
        out = super()._generate(prompts)
        if self.model.training:  # every process's rows, in rank order (as TRL gathers the rewards)
            from accelerate.utils import gather_object

            rows = [(list(p), list(c)) for p, c in zip(out[0], out[1])]
            rows = gather_object(rows) if self.accelerator.num_processes > 1 else rows
            self.generated.append(([p for p, _ in rows], [c for _, c in rows]))
        return out

    def _generate_and_score_completions(self, inputs):
        if self.model.training:
            self.snapshots.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        return super()._generate_and_score_completions(inputs)


def _dro_in_trl(tmp_path, ckpt, strategy, strategy_kwargs, *, steps=2, **extra):
    """TRL's loop with a DRO strategy, and per step this package's own DRO (its Curator's processors) fed the same
    completions (TRL's token ids, this package's Completion text: special tokens kept, the final EOS dropped), the
    rewards TRL scored and the model TRL had at that step: returns (trainer, per step: (kept groups, their
    advantages, the model))."""
    import copy

    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Group, group_advantages
    from rlcurate.policy.model import ModelPolicy
    from rlcurate.rollout.base import Completion
    from rlcurate.tasks.arithmetic import ArithmeticTask

    trainer = _train_dapo(tmp_path, ckpt, steps=steps, strategy=strategy, strategy_kwargs=strategy_kwargs,
                          cls=DroRecording, with_task=True, max_completion_length=12, **extra)
    tok = trainer.processing_class
    task = ArithmeticTask(levels=["add2", "add3"], n_train=12, n_test=2, seed=0)
    problems, G = task.problems("train"), trainer.num_generations
    eos = set(trainer.eos_token_ids)
    ours = build_curator(strategy, **strategy_kwargs)
    assert len(trainer.step_log) == len(trainer.snapshots) == steps
    out = []
    for step, log in enumerate(trainer.step_log):
        assert log["calls"] == 1  # a plain sampler: one generation batch per step
        (idx, rewards, texts), (pids, cids) = trainer.rounds[step], trainer.generated[step]
        groups = []
        for k in range(0, len(idx), G):
            comps = [Completion(0, j, pids[k + j], cids[k + j], tok.decode(
                cids[k + j][:-1] if cids[k + j][-1] in eos else cids[k + j], skip_special_tokens=False), [], "stop")
                for j in range(G)]
            groups.append(Group(index=int(idx[k]), problem=problems[int(idx[k])], prompt=texts[k], completions=comps,
                                rewards=np.array(rewards[k:k + G], dtype=float), generated=G))
        model = copy.deepcopy(trainer.model)
        model.load_state_dict(trainer.snapshots[step])
        policy = ModelPolicy(model, tok)
        from types import SimpleNamespace

        ctx = SimpleNamespace(tokenizer=tok, task=task, sequence_logprobs=policy.sequence_logprobs, step=step)
        kept = ours.process(ctx, groups)
        assert [g.index for g in kept] == log["kept"]
        out.append((kept, [group_advantages(g, "grpo", 1e-4) for g in kept], model))
    return trainer, out


def _per_token_advantages(kept, advantages) -> list[np.ndarray]:
    """This package's A_i * w_it per completion (the weight its loss multiplies the token's policy term by)."""
    return [a * (np.ones(len(c.token_ids)) if g.token_weights is None else np.asarray(g.token_weights[j]))
            for g, adv in zip(kept, advantages) for j, (c, a) in enumerate(zip(g.completions, adv))]


def _losses_and_grads(trainer, batch, kept, advantages, model, loss_agg):
    """TRL's loss of the recorded batch (its _compute_loss) and this package's (rlcurate.train.loss.policy_loss with
    the aggregation ``loss_agg``), each with its gradient, on two copies of ``model``."""
    import copy

    from rlcurate.train.loss import TrainSample, aggregation_coefficients, forward_logprobs, policy_loss

    theirs, mine = copy.deepcopy(model), copy.deepcopy(model)
    theirs.train(), mine.train()
    loss_trl = trainer._compute_loss(theirs, {k: v for k, v in batch.items()})
    loss_trl.backward()
    samples = [TrainSample(list(c.prompt_token_ids), list(c.token_ids), float(a),
                           None if g.token_weights is None else np.asarray(g.token_weights[j], dtype=float))
               for g, adv in zip(kept, advantages) for j, (c, a) in enumerate(zip(g.completions, adv))]
    aggregation_coefficients(samples, loss_agg, trainer.max_completion_length)
    logp, mask, _ = forward_logprobs(mine, samples, 1.0, trainer.processing_class.pad_token_id)
    loss_ours, _ = policy_loss(logp, mask, samples, 0.2, 0.2, 0.0)
    loss_ours.backward()
    grads = [(p.grad, q.grad) for p, q in zip(theirs.parameters(), mine.parameters()) if q.grad is not None]
    return float(loss_trl.detach()), float(loss_ours.detach()), grads


@pytest.mark.slow
def test_dro_token_weights_in_trl_agree_with_this_packages_dro(tmp_path, tiny_checkpoint):
    """DRO's token weights (chapter 8, use_as='token_weights') inside TRL's GRPOTrainer loop: fed the completions TRL
    generated, the rewards it scored and the model it had, this package's DRO gives the same per-token weights and
    advantages (TRL's (B, T) advantages are A_i w_it: float32 against float64), and TRL's loss_type 'grpo' gives this
    package's seq-mean-token-mean loss and gradient (two forward passes that differ in float32 rounding only); two
    real steps change the model."""
    trainer, steps = _dro_in_trl(tmp_path, tiny_checkpoint, "dro", {"use_as": "token_weights"}, loss_type="grpo")
    weighted = 0
    for (kept, advantages, model), batch in zip(steps, trainer.batches):
        expected = _per_token_advantages(kept, advantages)
        assert batch["advantages"].shape == batch["completion_ids"].shape and len(expected) == 8
        for r, (e, c) in enumerate(zip(expected, (c for g in kept for c in g.completions))):
            n = len(c.token_ids)
            assert batch["completion_ids"][r, :n].tolist() == list(c.token_ids)
            assert batch["completion_mask"][r].sum() == n
            np.testing.assert_allclose(batch["advantages"][r, :n].numpy(), e, rtol=1e-6, atol=1e-7)
        weighted += sum(int((np.asarray(w) != 1).any() and a != 0)  # a weighted token with a gradient
                        for g, adv in zip(kept, advantages) for w, a in zip(g.token_weights, adv))
        loss_trl, loss_ours, grads = _losses_and_grads(trainer, batch, kept, advantages, model, "seq-mean-token-mean")
        assert loss_trl == pytest.approx(loss_ours, rel=1e-5, abs=1e-7)
        for a, b in grads:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert weighted > 0  # some completions wrote an answer span whose reference tokens depend on the reasoning
    # (on-policy the loss's value is blind to the weights, sum_t A w_t = A n_i: the gradient is what tells)
    final = trainer.model.state_dict()
    assert any(not torch.equal(final[k], v) for k, v in trainer.snapshots[0].items())  # the steps trained
    logged = [h for h in trainer.state.log_history if "curation/dro_query_score_mean" in h]
    assert logged and max(h["curation/dro_query_score_mean"] for h in logged) > 0


@pytest.mark.slow
def test_insight_and_dro_compose_in_trl(tmp_path, tiny_checkpoint):
    """'insight+dro' with use_as='both' (R3 replaces the reward and weights the tokens) and the per-step group filter
    (filter_fraction 0.5: one of the two generated groups is dropped, its place filled with rows that carry no token):
    INSIGHT observes every scored completion, the kept group is this package's, its advantages (from R3) and token
    weights are this package's, and TRL's loss_type 'dapo' gives this package's token-mean loss and gradient."""
    kw = {"use_as": "both", "filter_fraction": 0.5}
    trainer, steps = _dro_in_trl(tmp_path, tiny_checkpoint, "insight+dro", kw, loss_type="dapo")
    assert type(trainer.curation.selector).__name__ == "InsightSelector" and trainer.curation.observed == 2
    for (kept, advantages, model), batch, log in zip(steps, trainer.batches, trainer.step_log):
        assert len(kept) == 1 and log["filled_groups"] == 1 and not batch["completion_mask"][4:].any()
        assert not np.isin(kept[0].rewards, [0.0, 1.0]).all()  # R3, not the coin
        for r, (e, c) in enumerate(zip(_per_token_advantages(kept, advantages), kept[0].completions)):
            np.testing.assert_allclose(batch["advantages"][r, :len(c.token_ids)].numpy(), e, rtol=1e-6, atol=1e-7)
        loss_trl, loss_ours, grads = _losses_and_grads(trainer, batch, kept, advantages, model, "token-mean")
        assert loss_trl == pytest.approx(loss_ours, rel=1e-5, abs=1e-7)
        for a, b in grads:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_trl_refuses_dro_where_it_would_not_be_this_packages_dro(tmp_path, tiny_checkpoint):
    """Before the model loads: DRO without the task that writes the reference answer, and DRO's token weights with a
    TRL loss that does not aggregate as one of this package's (bnpo: per micro-batch) or a sequence-level ratio."""
    with pytest.raises(ValueError, match=r"strategy 'dro' in TRL needs task= \(an rlcurate task"):
        _train_dapo(tmp_path, tiny_checkpoint, steps=1, strategy="dro")
    for extra, got in [({"loss_type": "bnpo"}, "loss_type='bnpo', importance_sampling_level='token'"),
                       ({"importance_sampling_level": "sequence", "loss_type": "grpo"},
                        "loss_type='grpo', importance_sampling_level='sequence'")]:
        with pytest.raises(ValueError, match=r"strategy 'insight\+dro' in TRL weights TRL's per-token loss as this "
                                             r"package's loss does only for loss_type 'dapo' .*; got " + got):
            _train_dapo(tmp_path, tiny_checkpoint, steps=1, strategy="insight+dro", with_task=True,
                        strategy_kwargs={"use_as": "both"}, **extra)
