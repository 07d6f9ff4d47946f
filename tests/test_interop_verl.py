"""rlcurate's prompt selection as a verl curriculum sampler, against verl's real classes (appendix A2).

What runs here is verl's own code: its ``RLHFDataset`` reads a parquet file and tokenises nothing
(verl 0.7.1 leaves chat templating to the rollout), its ``collate_fn`` and torchdata's
``StatefulDataLoader`` batch the rows exactly as ``RayPPOTrainer._create_dataloader`` does, verl's
``create_rl_sampler`` (the function's source, taken from ``verl/trainer/main_ppo.py`` and executed;
importing that module needs hydra, whose ANTLR grammar conflicts with the antlr 4.13 that math-verify
needs in this environment) builds the sampler from ``data.sampler.class_path``, and ``DataProto``
carries each step's batch into ``sampler.update`` as ``RayPPOTrainer.fit`` does. Only the rollout and
the reward are simulated: a known pass rate per prompt, the score on the last response token.

Needs ``verl`` (0.5 to 0.7.1, which still have the curriculum-sampler hook) installed without its GPU
dependencies; see appendix A2. Skipped with the reason when it is missing.
"""

from __future__ import annotations

import ast
import io
import json
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed (pip install --no-deps verl==0.7.1 plus the "
                                          "packages listed in appendix A2)")
sampler_mod = pytest.importorskip("verl.experimental.dataset.sampler",
                                  reason="this verl has no curriculum-sampler hook (removed in verl 0.8)")
from omegaconf import OmegaConf, open_dict  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.dataset.sampler import AbstractCurriculumSampler, AbstractSampler  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from verl.utils.import_utils import load_extern_object  # noqa: E402

from rlcurate.interop.verl import CurationSampler  # noqa: E402

N_PROMPTS, BATCH, N_RESP = 24, 4, 4


def verl_source(path: str, name: str, cls: str | None = None, **namespace):
    """A function of verl (or a method of its class ``cls``) compiled from its own source file ``path``
    (importing those modules needs hydra, Ray or peft, which this environment does not have for verl)."""
    src = Path(verl.__file__).parent / path
    body = ast.parse(src.read_text()).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module([fn], type_ignores=[]), str(src), "exec"), namespace)
    return namespace[name]


def verl_create_rl_sampler():
    """verl's ``create_rl_sampler``, compiled from its own source in ``verl/trainer/main_ppo.py``."""
    return verl_source("trainer/main_ppo.py", "create_rl_sampler", AbstractSampler=AbstractSampler,
                       load_extern_object=load_extern_object)


GET_GEN_BATCH = verl_source("trainer/ppo/ray_trainer.py", "_get_gen_batch", cls="RayPPOTrainer", DataProto=DataProto)


@pytest.fixture(scope="module")
def tokenizer():
    from rlcurate.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    """A verl-format training file: chat prompts, ground truth, extra_info with non-positional ids."""
    import datasets

    rows = []
    for i in range(N_PROMPTS):
        a, b = 10 + 3 * i, 7 + i
        rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"index": 1000 + 7 * i, "split": "train", "uid": f"add:{a}+{b}"}})
    path = tmp_path_factory.mktemp("verl") / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def data_config(parquet, **sampler):
    """verl's own data config (``legacy_data.yaml``) with the overrides a user would pass."""
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "data" / "legacy_data.yaml")
    OmegaConf.set_struct(base, True)
    with open_dict(base):  # Hydra's `+data.sampler.strategy=...` adds keys the same way
        base.train_files = str(parquet)
        base.train_batch_size = BATCH
        base.dataloader_num_workers = 0
        base.shuffle = False
        base.seed = 3
        base.max_prompt_length = 64
        base.tool_config_path = None
        base.sampler.class_path = "pkg://rlcurate.interop.verl"
        base.sampler.class_name = "CurationSampler"
        for k, v in sampler.items():
            base.sampler[k] = v
    return base


def make_loader(parquet, tokenizer, cfg):
    """What ``RayPPOTrainer._create_dataloader`` builds."""
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=cfg)
    sampler = verl_create_rl_sampler()(cfg, dataset)
    loader = StatefulDataLoader(dataset=dataset, batch_size=cfg.get("gen_batch_size", cfg.train_batch_size),
                                num_workers=cfg["dataloader_num_workers"], drop_last=True, collate_fn=collate_fn,
                                sampler=sampler)
    return dataset, sampler, loader


def true_pass_rate(index: int) -> float:
    return (index * 37 % 100) / 100


def simulate_step(batch_dict, rng, scored, reward_loop: bool = True):
    """One step of ``RayPPOTrainer.fit`` from the dataloader's batch to ``sampler.update``: uids, verl's own
    ``_get_gen_batch`` (it moves ``index`` and every key but the reward keys into the generation batch), the
    generation batch repeated n times and generated, the output united with ``batch.repeat(n, interleave=True)``,
    a score on each response's last token, the batch reordered (``_balance_batch``). With ``reward_loop``
    (verl's default without a reward model: reward-loop workers stream the rewards) the agent loop returns none
    of its input's non-tensor keys, so ``index`` is gone by ``sampler.update``; without, it copies them back."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = GET_GEN_BATCH(None, batch).repeat(repeat_times=N_RESP, interleave=True)
    n, L = len(gen_batch), 6
    lengths = rng.integers(1, L + 1, size=n)
    scores = torch.zeros(n, L)
    for r, (idx, length) in enumerate(zip(gen_batch.non_tensor_batch["index"], lengths)):
        reward = float(rng.random() < true_pass_rate(int(idx)))
        scores[r, length - 1] = reward
        scored.append((int(idx), reward))
    mask = (torch.arange(L)[None, :] < torch.as_tensor(lengths)[:, None]).long()
    non_tensors = {"__num_turns__": np.full(n, 2, dtype=np.int32)}
    if not reward_loop:
        non_tensors.update(gen_batch.non_tensor_batch)
    out = DataProto.from_dict(tensors={"token_level_scores": scores, "response_mask": mask}, non_tensors=non_tensors)
    batch = batch.repeat(repeat_times=N_RESP, interleave=True).union(out)
    assert ("index" in batch.non_tensor_batch) == (not reward_loop)
    batch.reorder(torch.as_tensor(rng.permutation(n)))
    return batch


@pytest.mark.parametrize("reward_loop", [True, False], ids=["reward_loop", "index_copied_back"])
def test_verl_builds_and_drives_the_sampler(parquet, tokenizer, reward_loop):
    cfg = data_config(parquet, strategy="insight", strategy_kwargs={"mu": 0.3}, group_size=N_RESP)
    dataset, sampler, loader = make_loader(parquet, tokenizer, cfg)
    assert isinstance(sampler, CurationSampler)
    assert isinstance(sampler, AbstractSampler) and isinstance(sampler, AbstractCurriculumSampler)
    assert len(loader) == N_PROMPTS // BATCH
    rng = np.random.default_rng(0)
    scored: list[tuple[int, float]] = []
    seen_batches = []
    for step, batch_dict in enumerate(loader):  # RayPPOTrainer.fit
        ids = [int(i) for i in batch_dict["index"]]
        assert len(set(ids)) == BATCH and set(ids) <= {1000 + 7 * i for i in range(N_PROMPTS)}
        seen_batches.append(ids)
        batch = simulate_step(batch_dict, rng, scored, reward_loop)
        if isinstance(loader.sampler, AbstractCurriculumSampler):  # ray_trainer.py, after each step
            loader.sampler.update(batch=batch)
    sel = sampler.selection
    assert sel.observed == len(seen_batches) == N_PROMPTS // BATCH
    # no lag: each selection saw the rewards of every earlier step (num_workers = 0, no prefetch)
    assert [h["observed"] for h in sel.history] == list(range(len(seen_batches)))
    # the batches verl trained on are the sampler's choices, mapped from positions to extra_info ids
    assert seen_batches == [[1000 + 7 * p for p in h["indices"]] for h in sel.history]
    # beliefs hold exactly the scores verl reported
    b = sel.selector.beliefs
    for pos in range(N_PROMPTS):
        mine = [r for i, r in scored if i == 1000 + 7 * pos]
        assert b.alpha[pos] - 1 == sum(mine) and b.beta[pos] - 1 == len(mine) - sum(mine)
    assert sampler.last_update and all(k == N_RESP for _, k in sampler.last_update.values())


def test_sampler_state_travels_with_the_dataloader_checkpoint(parquet, tokenizer):
    """verl saves ``train_dataloader.state_dict()`` in data.pt. verl 0.7.1's ``fit()`` saves it before it feeds the
    sampler the step's rewards (``_save_checkpoint`` at ray_trainer.py:1529, ``sampler.update`` at :1600), so the
    resumed beliefs hold every step but the checkpoint's own, and the run goes on with the rest of the epoch."""
    cfg = data_config(parquet, strategy="mopps")
    _, sampler, loader = make_loader(parquet, tokenizer, cfg)
    rng = np.random.default_rng(1)
    scored: list = []
    it = iter(loader)
    buf = io.BytesIO()
    for step in range(3):
        batch = next(it)
        if step == 2:  # the checkpoint step, in fit()'s order: saved first, then fed
            alpha_saved = sampler.selection.selector.beliefs.alpha.copy()
            torch.save(loader.state_dict(), buf)  # RayPPOTrainer._save_checkpoint
        sampler.update(simulate_step(batch, rng, scored))
    assert not np.array_equal(sampler.selection.selector.beliefs.alpha, alpha_saved)  # step 3's rewards came after

    _, sampler2, loader2 = make_loader(parquet, tokenizer, cfg)  # a new process resumes
    buf.seek(0)
    loader2.load_state_dict(torch.load(buf, weights_only=False))  # RayPPOTrainer._load_checkpoint
    it2 = iter(loader2)  # torchdata applies the saved state when fit() starts iterating
    assert np.array_equal(sampler2.selection.selector.beliefs.alpha, alpha_saved)
    assert sampler2.selection.observed == 2  # the checkpoint step's rewards are not in it
    batches = list(it2)
    assert len(batches) == N_PROMPTS // BATCH - 3  # the rest of the epoch
    state = sampler2.state_dict()
    assert json.loads(json.dumps(state)) == state


def test_a_checkpoint_taken_mid_chunk_resumes_with_the_rest_of_the_chunk(parquet, tokenizer):
    """verl 0.9 under DAPO fetches one prompt at a time from chunks of ``gen_batch_size``: a checkpoint can fall
    inside a chunk, and the resumed run must hand out the prompts the uninterrupted one does, selecting when it does."""
    from rlcurate.interop.verl import CurationSampler

    cfg = data_config(parquet, strategy="mopps")
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=cfg)
    rng = np.random.default_rng(4)

    def feed(sampler, served):  # the rewards of the prompts served so far, once per whole chunk
        if len(served) % BATCH == 0:
            sampler.observe([sampler.data_source.dataframe["extra_info"][p]["index"] for p in served[-BATCH:]
                             for _ in range(N_RESP)], rng_rewards[len(served) // BATCH - 1])

    rng_rewards = [rng.integers(0, 2, size=BATCH * N_RESP).astype(float) for _ in range(N_PROMPTS // BATCH)]
    full = CurationSampler(dataset, cfg, batch_size=BATCH)
    uninterrupted = []
    for p in full:
        uninterrupted.append(p)
        feed(full, uninterrupted)
    assert len(uninterrupted) == N_PROMPTS // BATCH * BATCH

    cut = BATCH + BATCH // 2 + 1  # inside the second chunk
    first = CurationSampler(dataset, cfg, batch_size=BATCH)
    served, it = [], iter(first)
    for _ in range(cut):
        served.append(next(it))
        feed(first, served)
    state = json.loads(json.dumps(first.state_dict()))  # what data.pt holds
    assert state["pending"] == uninterrupted[cut:2 * BATCH]
    resumed = CurationSampler(dataset, cfg, batch_size=BATCH)
    resumed.load_state_dict(state)
    for p in resumed:
        served.append(p)
        feed(resumed, served)
    assert served == uninterrupted
    assert resumed.selection.history[-1] == full.selection.history[-1]  # the last choice made on the same evidence
    # a checkpoint saved before the rest of a chunk was kept (no "pending") still loads: a new chunk is chosen
    old = {k: v for k, v in state.items() if k != "pending"}
    again = CurationSampler(dataset, cfg, batch_size=BATCH)
    again.load_state_dict(old)
    assert len(list(again)) == (N_PROMPTS // BATCH - 2) * BATCH
    # a group size the host fixes (data.sampler.group_size, or verl 0.9's rollout.n) outlives a checkpoint that
    # learnt another (a run saved with rollout.n = 12, or before a prompt repeated in a step counted once)
    fixed = CurationSampler(dataset, cfg, batch_size=BATCH)
    fixed.fix_group_size(N_RESP)
    fixed.load_state_dict({**state, "selection": {**state["selection"], "group_size": 3 * N_RESP}})
    assert fixed.selection.group_size == N_RESP


def test_prefilter_and_errors(parquet, tokenizer, tmp_path):
    audit = tmp_path / "mixed.jsonl"
    kept = ["add:13+8", "add:19+10", "add:22+11", "add:31+14"]
    audit.write_text("".join(json.dumps({"uid": u}) + "\n" for u in kept))
    cfg = data_config(parquet, strategy="prefilter", strategy_kwargs={"audit_file": str(audit)}, uid_key="uid")
    dataset, sampler, loader = make_loader(parquet, tokenizer, cfg)
    ids = {int(i) for b in loader for i in b["index"]}
    uid_of = {info["index"]: info["uid"] for info in dataset.dataframe["extra_info"]}
    assert {uid_of[i] for i in ids} == set(kept)

    bad = data_config(parquet, strategy="dapo")
    with pytest.raises(ValueError, match="acts on responses"):
        make_loader(parquet, tokenizer, bad)
    # a selector that needs this package's step is refused when the sampler is built, not at its first draw
    # (issue #32: dro_filter used to be accepted, then its first select raised)
    for name, why in (("dro_filter", "scores them with the policy"), ("oracle_select", "audits the trainer runs")):
        with pytest.raises(ValueError, match=f"cannot run in another trainer's sampler: .*{why}"):
            make_loader(parquet, tokenizer, data_config(parquet, strategy=name))
    workers = data_config(parquet, strategy="insight")
    workers.dataloader_num_workers = 2
    with pytest.raises(ValueError, match="num_workers"):
        CurationSampler(RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=workers), workers)


def test_pool_baseline_advantage_is_registered_with_verl():
    """The advantage hook a response-level strategy needs (appendix A2): verl's registry returns it,
    and it matches rlcurate's own pool-baseline GRPO advantage (up to the pool-size correction)."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from rlcurate.curation.base import Group
    from rlcurate.interop.verl import POOL_ADV_ESTIMATOR, pool_baseline_advantage
    from rlcurate.tasks.base import Problem
    from rlcurate.curation.base import group_advantages

    fn = core_algos.get_adv_estimator_fn(POOL_ADV_ESTIMATOR)
    assert fn is pool_baseline_advantage
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    p_hat, pool = 0.375, 10**6  # a large pool: the n / (n - 1) correction vanishes
    L = 5
    tl = torch.zeros(6, L)
    tl[:, 2] = torch.as_tensor(rewards, dtype=torch.float32)
    mask = torch.ones(6, L)
    mask[:, 3:] = 0
    adv, ret = fn(token_level_rewards=tl, response_mask=mask, index=np.array(["u"] * 6, dtype=object),
                  reward_baselines=torch.full((6,), p_hat), config=None)
    g = Group(index=0, problem=Problem("u", "q", "a"), prompt="p", completions=[None] * 6, rewards=rewards,
              baseline=p_hat, pool_size=pool)
    expected = group_advantages(g, "grpo", 1e-6)
    assert torch.allclose(adv[:, 0], torch.as_tensor(expected, dtype=torch.float32), atol=1e-5)
    assert torch.all(adv[:, 3:] == 0) and torch.equal(adv, ret)
    # without a pool baseline it is verl's own GRPO
    a2, _ = fn(token_level_rewards=tl, response_mask=mask, index=np.array(["u"] * 6, dtype=object))
    a3, _ = core_algos.compute_grpo_outcome_advantage(tl, mask, np.array(["u"] * 6, dtype=object))
    assert torch.equal(a2, a3)
    # verl hands over its AlgoConfig; its norm_adv_by_std_in_grpo=False (Dr. GRPO) decides, with and without baselines
    from verl.trainer.config import AlgoConfig

    dr = AlgoConfig(norm_adv_by_std_in_grpo=False)
    a4, _ = fn(token_level_rewards=tl, response_mask=mask, index=np.array(["u"] * 6, dtype=object),
               reward_baselines=torch.full((6,), p_hat), config=dr)
    assert torch.allclose(a4[:, 0], torch.as_tensor(rewards - p_hat, dtype=torch.float32))
    a5, _ = fn(token_level_rewards=tl, response_mask=mask, index=np.array(["u"] * 6, dtype=object), config=dr)
    a6, _ = core_algos.compute_grpo_outcome_advantage(tl, mask, np.array(["u"] * 6, dtype=object),
                                                      norm_adv_by_std_in_grpo=False)
    assert torch.equal(a5, a6) and torch.allclose(a5[:, 0], torch.as_tensor(rewards - rewards.mean(), dtype=torch.float32))


def test_pool_baseline_advantage_refuses_a_verl_that_never_passes_the_baselines(monkeypatch):
    """verl 0.8 and later (measured on 0.9.1: the v1 trainer's _compute_advantage passes a fixed list of fields)
    never hand reward_baselines to a registered estimator; there the estimator says so instead of computing plain
    GRPO without a word (issue #32)."""
    import rlcurate.interop.verl as adapter

    tl, mask = torch.zeros(2, 3), torch.ones(2, 3)
    monkeypatch.setattr(adapter, "VERL_VERSION", (0, 9, 1))
    with pytest.raises(ValueError, match="received no reward_baselines: verl 0.9.1's trainer passes a fixed list"):
        adapter.pool_baseline_advantage(tl, mask, np.array(["u", "u"], dtype=object))
    assert adapter._version("0.9.1.dev0") == (0, 9, 1) and adapter.TESTED_VERL == (0, 7, 1)


def test_prompt_ids_fall_back_to_extra_info_and_refuse_a_batch_without_them():
    from rlcurate.interop.verl import prompt_ids

    both = {"index": np.array([3, 5], dtype=object), "extra_info": np.array([{"index": 9}, {"index": 9}], dtype=object)}
    assert list(prompt_ids(both)) == [3, 5]  # index first: it is what RLHFDataset copied from extra_info
    assert list(prompt_ids({"extra_info": np.array([{"index": 3}, {"index": 5}], dtype=object)})) == [3, 5]
    for bad in ({}, {"extra_info": np.array([{"index": 3}, {"split": "train"}], dtype=object)}):
        with pytest.raises(ValueError, match=r"neither non_tensor_batch\['index'\] nor an extra_info\['index'\]"):
            prompt_ids(bad)


def test_a_sampler_that_is_never_fed_says_so_once(parquet, tokenizer):
    """verl's DAPO recipe (``RayDAPOTrainer.fit``) builds the curriculum sampler but never calls its ``update``:
    INSIGHT would choose without feedback for the whole run. After three selections with no reward the sampler
    warns once; a sampler fed after every step does not."""
    cfg = data_config(parquet, strategy="insight")
    _, sampler, loader = make_loader(parquet, tokenizer, cfg)
    with pytest.warns(UserWarning, match=r"3 selections and no rewards observed: the insight selector is choosing "
                                         r"without feedback; .*sampler.update\(batch\)") as caught:
        it = iter(loader)
        for _ in range(5):
            next(it)
    assert sum("without feedback" in str(w.message) for w in caught) == 1
    _, fed, loader = make_loader(parquet, tokenizer, cfg)
    rng, scored = np.random.default_rng(2), []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        it = iter(loader)
        for _ in range(5):
            fed.update(simulate_step(next(it), rng, scored))
