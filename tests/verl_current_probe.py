"""Runs rlcurate's verl >= 0.8 adapter against verl 0.9.1's real classes; prints one JSON object.

Started by ``tests/test_interop_verl_current.py`` in a subprocess whose ``PYTHONPATH`` puts
``.venv/verl-0.9.1`` (verl 0.9.1, TransferQueue, hydra's omegaconf) before the virtual environment, with
``VERL_USE_EXTERNAL_MODULES=rlcurate.interop.verl_v1``, the way a user selects the registered trainer.
What is verl's own code here: the trainer registry, the config (verl's generated ``ppo_trainer``
defaults), ``PPOTrainer._init_dataloader`` (``RLHFDataset`` on a parquet file, ``collate_fn``,
``StatefulDataLoader``), ``step`` with its ``prepare_step`` / ``_next_train_batch`` (dataloader fetch, uids),
``list_of_dict_to_tensordict`` (how the agent loop packs trajectories), ``assign_non_tensor_stack`` (the hinted
``raw_prompt`` as the agent loop reads it), and the replay buffer's DAPO filter.
Stubbed: TransferQueue (a dict behind ``kv_batch_get`` / ``kv_batch_put``), the rollout (a known pass
rate per prompt) and the part of ``_step_once`` that needs GPU workers (it returns the step's trajectories).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
N_PROMPTS, BATCH, N_RESP, STEPS = 24, 4, 4, 4


def pass_rate(index: int) -> float:
    return (index * 37 % 100) / 100


# ------------------------------------------------------------------------------------------------ a stub store
class Store:
    """TransferQueue's key-value calls over a dict; values are packed by verl's own helper."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.gets: list[list[str]] = []

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        if fields is not None and not isinstance(fields, list):
            raise TypeError("the stub stores lists of dicts only")
        for j, key in enumerate(keys):
            self.rows.setdefault(key, {}).update(fields[j] if fields else {})

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.gets.append(list(keys))
        return list_of_dict_to_tensordict([{f: self.rows[k][f] for f in select_fields} for k in keys])


class SubmittedPrompts:
    """A stand-in for verl's agent loop manager that records the ``(uid, index)`` of every prompt submitted."""

    def __init__(self):
        self.submitted: list = []

    def generate_sequences(self, batch):
        self.submitted += list(zip(list(batch["uid"]), [int(i) for i in batch["index"]]))


def verl_config(parquet: str, **changes):
    """verl's full default PPO config (the generated ppo_trainer.yaml) with a user's overrides."""
    import verl
    from omegaconf import OmegaConf, open_dict

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    with open_dict(cfg):
        cfg.data.train_files = cfg.data.val_files = parquet
        cfg.data.train_batch_size = BATCH
        cfg.data.dataloader_num_workers = 0
        cfg.data.max_prompt_length = 64
        cfg.data.seed = 3
        cfg.actor_rollout_ref.rollout.n = N_RESP
        cfg.data.sampler = {"strategy": "insight", "strategy_kwargs": {"mu": 0.3}, "group_size": N_RESP}
        cfg.trainer.v1.trainer_mode = "rlcurate_curated"  # as a user selects it
        for key, value in changes.items():
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def make_parquet(folder: str) -> str:
    import datasets

    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": f"{10 + 3 * i}+{7 + i}="}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(17 + 4 * i)},
             "extra_info": {"index": 1000 + 7 * i, "split": "train"}} for i in range(N_PROMPTS)]
    path = os.path.join(folder, "train.parquet")
    datasets.Dataset.from_list(rows).to_parquet(path)
    return path


def bare_trainer(cls, cfg, tokenizer):
    """The trainer built by its own ``__init__`` (verl's ``PPOTrainer.__init__`` runs on the CPU: config, replay
    buffer) with the tokenizer ``init()`` would load; no workers."""
    trainer = cls(cfg)
    trainer.tokenizer, trainer.processor = tokenizer, None
    return trainer


# ------------------------------------------------------------------------------------------------ checks
def check_registry(out: dict) -> None:
    import verl
    from verl.trainer.ppo.v1 import PPOTrainer, PPOTrainerSync, get_trainer_cls

    cls = get_trainer_cls("rlcurate_curated")  # registered by VERL_USE_EXTERNAL_MODULES, as in a run
    import rlcurate.interop.verl_v1 as v1

    trainer = cls(verl_config(os.devnull))  # selected by the name; runs as verl's sync mode
    out["registry"] = {"mode_after_init": trainer.trainer_mode, "config_mode": trainer.config.trainer.v1.trainer_mode,
                       "replay_buffer": type(trainer.replay_buffer).__name__,
                       "verl": verl.__version__, "is_ours": cls is v1.CuratedPPOTrainer,
                       "sync_class_is_parent": cls.__mro__[1] is get_trainer_cls("sync") is PPOTrainerSync,
                       "is_ppo_trainer": issubclass(cls, PPOTrainer),
                       "imported_by_verl": "rlcurate.interop.verl_v1" in os.environ.get("VERL_USE_EXTERNAL_MODULES", "")}


def check_dataloader(out: dict, parquet: str, tokenizer) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    import rlcurate.interop.verl_v1 as v1
    from rlcurate.interop.verl import CurationSampler

    res = {}
    for name, changes in (("plain", {}), ("dapo", {"algorithm.filter_groups.enable": True})):
        trainer = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet, **changes), tokenizer)
        trainer._init_dataloader()  # verl's PPOTrainer._init_dataloader, then ours
        loader = trainer.train_dataloader
        res[name] = {"loader": type(loader).__name__, "is_stateful": isinstance(loader, StatefulDataLoader),
                     "sampler": type(loader.sampler).__name__, "is_curation": isinstance(loader.sampler, CurationSampler),
                     "strategy": loader.sampler.selection.selector.name, "loader_batch": loader.batch_size,
                     "prompts_per_selection": loader.sampler.batch_size, "steps_per_epoch": trainer.steps_per_epoch,
                     "same_dataset": loader.dataset is trainer.train_dataset,
                     "replay_buffer": type(trainer.replay_buffer).__name__}
    # the sampler's state is in the dataloader's, which verl saves in data.pt
    trainer = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet), tokenizer)
    trainer._init_dataloader()
    it = iter(trainer.train_dataloader)
    next(it)
    trainer.train_dataloader.sampler.observe([1000, 1000, 1007], [1.0, 0.0, 1.0])
    state = trainer.train_dataloader.state_dict()
    after = [int(i) for i in next(it)["index"]]
    again = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet), tokenizer)
    again._init_dataloader()
    again.train_dataloader.load_state_dict(state)
    resumed = [int(i) for i in next(iter(again.train_dataloader))["index"]]
    res["resume"] = {"continues": resumed == after, "next": after, "resumed": resumed,
                     "alpha_restored": bool(np.array_equal(again.train_dataloader.sampler.selection.selector.beliefs.alpha,
                                                           trainer.train_dataloader.sampler.selection.selector.beliefs.alpha))}
    # the pool-baseline estimator is refused when the trainer is built, before any worker starts
    try:
        v1.CuratedPPOTrainer(verl_config(parquet, **{"algorithm.adv_estimator": "rlcurate_pool_grpo"}))
        res["pool_refused"] = ""
    except ValueError as exc:
        res["pool_refused"] = str(exc)
    out["dataloader"] = res


def check_custom_sampler(out: dict, parquet: str, tokenizer) -> None:
    """``trainer.v1.sampler.custom_sampler``: a subclass of verl's buffer keeps the evidence of the groups it clears;
    a buffer that is not one is warned of when the dataloader is built (the selector would never see the groups it
    drops), for a selector that learns from rewards only."""
    import logging
    import tempfile

    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    import rlcurate.interop.verl_v1 as v1

    res = {}
    with tempfile.TemporaryDirectory() as folder:
        module = os.path.join(folder, "my_buffers.py")
        with open(module, "w") as f:
            f.write("from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer\n"
                    "from rlcurate.interop.verl_v1 import EvidenceKeepingReplayBuffer\n"
                    "class MyBuffer(ReplayBuffer):\n    pass\n"
                    "class MyKeeping(EvidenceKeepingReplayBuffer):\n    pass\n"
                    "class OwnBuffer:\n    def __init__(self, **kwargs):\n        self.kwargs = kwargs\n")

        class BuildsItsOwn(v1.CuratedPPOTrainer):  # a subclass that builds its buffer without verl's method
            def _build_replay_buffer(self):
                return type("OwnBuffer", (), {})()

        for name, strategy in (("MyBuffer", "insight"), ("MyKeeping", "insight"), ("OwnBuffer", "insight"),
                               ("OwnBuffer", "uniform"), ("BuildsItsOwn", "insight")):
            records = []
            handler = logging.Handler()
            handler.emit = records.append
            logging.getLogger(v1.__name__).addHandler(handler)
            try:
                custom = {} if name == "BuildsItsOwn" else {
                    "trainer.v1.sampler.custom_sampler": {"path": module, "name": name}}
                trainer = bare_trainer(BuildsItsOwn if name == "BuildsItsOwn" else v1.CuratedPPOTrainer, verl_config(
                    parquet, **custom, **{"data.sampler": {"strategy": strategy, "group_size": N_RESP}}), tokenizer)
                trainer._init_dataloader()
            finally:
                logging.getLogger(v1.__name__).removeHandler(handler)
            buffer = trainer.replay_buffer
            read = None
            if isinstance(buffer, v1.EvidenceKeeping):  # a group the subclass clears is read first
                import transfer_queue as tq
                from transfer_queue import KVBatchMeta

                store = TensorStore({}, KVBatchMeta(partition_id="train", keys=[], tags=[]))
                tq.kv_batch_put, tq.kv_batch_get, tq.kv_clear = store.kv_batch_put, store.kv_batch_get, store.kv_clear
                store.rows["u1"] = {}  # the prompt's own key, which verl clears with its trajectories
                for s_ in range(2):
                    store.rows[f"u1_{s_}_0"] = {"index": 1007, "rm_scores": torch.tensor([0.0, float(s_)])}
                    buffer.partitions["train"][f"u1_{s_}_0"] = {"status": "success", "seq_len": 2}
                buffer._clear_groups("train", {"u1"})
                read = [list(part) for part in buffer.cleared[0]]
            res[f"{name} {strategy}"] = {"read": read,
                "class": type(buffer).__name__, "bases": [c.__name__ for c in type(buffer).__mro__[:3]],
                "keeps": isinstance(buffer, v1.EvidenceKeeping),
                "is_replay_buffer": isinstance(buffer, ReplayBuffer),
                "warnings": [r.getMessage() for r in records if r.levelno >= logging.WARNING]}
    out["custom_sampler"] = res


def check_dapo_evidence(out: dict, parquet: str, tokenizer) -> None:
    """INSIGHT under DAPO's filter: verl's ``step`` runs with a stand-in ``_step_once`` in which verl's own replay
    buffer classifies the step's finished groups and evicts the flat ones (``_terminal_eviction_reasons``,
    ``_evict_terminal_groups``) and returns the mixed ones as the trained batch. The selector must observe the
    evicted groups too (``evidence="generated"``), and only the trained ones with ``evidence="trained"``."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    import rlcurate.interop.verl_v1 as v1

    res = {}
    refills = None
    for evidence in ("generated", "trained"):
        if evidence == "generated":
            refills = []
        store = TensorStore({}, KVBatchMeta(partition_id="train", keys=[], tags=[]))
        tq.kv_batch_put, tq.kv_batch_get, tq.kv_clear = store.kv_batch_put, store.kv_batch_get, store.kv_clear
        sampler = {"strategy": "insight", "strategy_kwargs": {"evidence": evidence}, "group_size": N_RESP}
        trainer = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet, **{"algorithm.filter_groups.enable": True,
                                                                             "algorithm.filter_groups.metric": "acc",
                                                                             "data.sampler": sampler}), tokenizer)
        trainer._init_dataloader()
        trainer.global_steps = 1
        buf = trainer.replay_buffer
        buf.filter_groups_metric = "reward"  # verl's canonical reward (rm_scores): what the stand-in writes
        tally = {"trained": 0, "evicted": 0, "evicted_prompts": set(), "evicted_successes": 0}

        trainer.agent_loop_manager = rollout = SubmittedPrompts()

        def step_once(self, metrics, timing_raw, size):
            keys, tags = [], []
            submitted, rollout.submitted = rollout.submitted, []
            for uid, idx in submitted:
                flat = idx % 3 == 0  # every third prompt: all its responses right or all wrong
                rewards = [float(idx % 2)] * N_RESP if flat else [float(s_ % 2) for s_ in range(N_RESP)]
                buf.finished_keys["train"].add(uid)
                for s_, r in enumerate(rewards):
                    key = f"{uid}_{s_}_0"
                    scores = torch.zeros(3, dtype=torch.float32)
                    scores[-1] = r
                    store.rows[key] = {"index": idx, "rm_scores": scores}
                    buf.partitions["train"][key] = {"status": "success", "seq_len": 3}
                    if not flat:
                        keys.append(key)
                        tags.append({"status": "success", "seq_len": 3})
                if flat:
                    tally["evicted"] += N_RESP
                    tally["evicted_prompts"].add(idx)
                    tally["evicted_successes"] += int(sum(rewards))
                else:
                    tally["trained"] += N_RESP
            reasons = buf._terminal_eviction_reasons(self.global_steps, "train")  # verl's DAPO classification
            buf._evict_terminal_groups(self.global_steps, "train", reasons)
            if refills is not None and reasons[1]:  # what verl's sample() loop then does via refill_fn (it polls)
                selection = self.train_dataloader.sampler.selection
                expected = copy.deepcopy(selection).more(len(reasons[1]), taken=list(self._step_prompts))
                step_prompts = list(self._step_prompts)
                buf.refill_fn(len(reasons[1]))
                got = self.train_dataloader.sampler.positions([i for _, i in rollout.submitted]).tolist()
                refills.append({"step_prompts": step_prompts, "refilled": got, "expected": expected})
                rollout.submitted = []  # not generated: the stand-in trains the step's first groups
            return KVBatchMeta(partition_id="train", keys=keys, tags=tags)

        PPOTrainer._step_once = step_once
        for _ in range(3):
            trainer.step({}, {})
            trainer.global_steps += 1
        b = trainer.train_dataloader.sampler.selection.selector.beliefs
        pos = trainer.train_dataloader.sampler.positions(sorted(tally["evicted_prompts"]))
        res[evidence] = {"trials": float((b.alpha + b.beta - 2).sum()), "trained": tally["trained"],
                         "rounds": trainer.train_dataloader.sampler.selection.rounds, "refills": refills or [],
                         "evicted": tally["evicted"], "evicted_trials": float((b.alpha + b.beta - 2)[pos].sum()),
                         "evicted_successes": tally["evicted_successes"],
                         "evicted_alpha": float((b.alpha - 1)[pos].sum()),
                         "cleared_left": len(buf.cleared), "store_left": len(store.rows)}
        refills = None
    out["dapo_evidence"] = res


def check_refills_past_the_pool(out: dict, parquet: str, tokenizer) -> None:
    """verl's refills within a step asking for more prompts than the pool has left (a step of 4 prompts topped up
    by 7, 7, 7, 3, 3, 3 and 3 on a pool of 24), over two steps driven by verl's ``step``; ``data.sampler`` without
    ``group_size``. Every response's reward is 0 or 1 by its position in the group (one right of two)."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    import rlcurate.interop.verl_v1 as v1

    store = TensorStore({}, KVBatchMeta(partition_id="train", keys=[], tags=[]))
    tq.kv_batch_put, tq.kv_batch_get, tq.kv_clear = store.kv_batch_put, store.kv_batch_get, store.kv_clear
    trainer = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet, **{
        "algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc",
        "data.sampler": {"strategy": "insight", "strategy_kwargs": {"mu": 0.3}}}), tokenizer)
    trainer._init_dataloader()
    trainer.global_steps = 1

    trainer.agent_loop_manager = rollout = SubmittedPrompts()
    steps = []

    def step_once(self, metrics, timing_raw, size):
        for k in (7, 7, 7, 3, 3, 3, 3):
            self._add_prompts_to_generate(k)
        submitted, rollout.submitted = rollout.submitted, []
        keys, tags = [], []
        for uid, idx in submitted:
            for s_ in range(N_RESP):
                key = f"{uid}_{s_}_0"
                scores = torch.zeros(3, dtype=torch.float32)
                scores[-1] = float(s_ % 2)
                store.rows[key] = {"index": idx, "rm_scores": scores}
                keys.append(key)
                tags.append({"status": "success", "seq_len": 3})
        steps.append(self.train_dataloader.sampler.positions([i for _, i in submitted]).tolist())
        return KVBatchMeta(partition_id="train", keys=keys, tags=tags)

    PPOTrainer._step_once = step_once
    for _ in range(2):
        trainer.step({}, {})
        trainer.global_steps += 1
    selection = trainer.train_dataloader.sampler.selection
    b = selection.selector.beliefs
    out["refills_past_the_pool"] = {"steps": steps, "group_size": selection.group_size, "rounds": selection.rounds,
                                    "trials": float((b.alpha + b.beta - 2).sum()), "responses": N_RESP,
                                    "pool": N_PROMPTS}


def check_update(out: dict, parquet: str, tokenizer) -> None:
    """verl's ``step`` drives the trainer; the sampler must end where a sampler fed the same rewards does."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    import rlcurate.interop.verl_v1 as v1
    from rlcurate.interop.verl import CurationSampler

    store, rng = Store(), np.random.default_rng(0)
    tq.kv_batch_put, tq.kv_batch_get = store.kv_batch_put, store.kv_batch_get
    trainer = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet), tokenizer)
    trainer._init_dataloader()
    trainer.global_steps = 1
    trained: list[list[tuple[int, float]]] = []  # per step, what verl trained on: (prompt id, reward) per response
    drawn: list[list[int]] = []

    class Rollout:  # the agent loop manager: n sessions per prompt, rm_scores on the last token
        def generate_sequences(self, batch):
            ids = [int(i) for i in batch["index"]]
            drawn.append(ids)
            trained.append([])
            keys, tags = [], []
            for uid, idx in zip(list(batch["uid"]), ids):
                for s in range(N_RESP):
                    reward, length = float(rng.random() < pass_rate(idx)), int(rng.integers(1, 6))
                    scores = torch.zeros(length, dtype=torch.float32)
                    scores[-1] = reward
                    outputs = 2 if s == 0 and idx % 2 == 0 else 1  # a two-turn session: the reward on both
                    for o in range(outputs):
                        keys.append(f"{uid}_{s}_{o}")
                        tags.append({"status": "success", "seq_len": length})
                        store.rows[keys[-1]] = {"index": idx, "rm_scores": scores.clone()}
                    trained[-1].append((idx, reward))
            keys.append(f"pad{uuid.uuid4().hex}_0_0")  # verl's padding row: a copy with zero reward
            tags.append({"status": "success", "seq_len": 1, "is_padding": True})
            store.rows[keys[-1]] = {"index": ids[0], "rm_scores": torch.zeros(1)}
            order = rng.permutation(len(keys))  # _balance_batch reorders
            self.batch = KVBatchMeta(partition_id="train", keys=[keys[j] for j in order], tags=[tags[j] for j in order])

    trainer.agent_loop_manager = rollout = Rollout()
    PPOTrainer._step_once = lambda self, metrics, timing_raw, size: rollout.batch  # the GPU part of a step
    metrics = {}
    for _ in range(STEPS):
        trainer.step(metrics, {})  # verl's step: prepare_step fetches the prompts, then _step_once
        trainer.global_steps += 1
    mine = trainer.train_dataloader.sampler

    ref = CurationSampler(trainer.train_dataset, trainer.config.data, batch_size=BATCH)
    ref_drawn = []
    for step in range(STEPS):  # the same rewards, fed directly, one step at a time
        ref_drawn.append([1000 + 7 * p for p in ref.selection.select(BATCH)])
        ref.observe([i for i, _ in trained[step]], [r for _, r in trained[step]])
    b, rb = mine.selection.selector.beliefs, ref.selection.selector.beliefs
    successes = {p: 0 for p in range(N_PROMPTS)}
    for i, r in (pair for step in trained for pair in step):
        successes[(i - 1000) // 7] += int(r)
    out["update"] = {"drawn": drawn, "ref_drawn": ref_drawn, "observed": mine.selection.observed,
                     "rounds_seen": [h["observed"] for h in mine.selection.history],
                     "alpha_equal": bool(np.array_equal(b.alpha, rb.alpha)), "beta_equal": bool(np.array_equal(b.beta, rb.beta)),
                     "alpha_minus_1": (b.alpha - 1).tolist(), "successes": [successes[p] for p in range(N_PROMPTS)],
                     "trials": float((b.alpha + b.beta - 2).sum()), "responses": sum(map(len, trained)),
                     "last_update": {str(k): list(v) for k, v in mine.last_update.items()},
                     "metrics": sorted(k for k in metrics if k.startswith("rlcurate/"))}


# DAPO: identical groups to verl's filter and to this package's.
DAPO_GROUPS = {
    "all0": [0.0, 0.0, 0.0, 0.0], "all1": [1.0, 1.0, 1.0, 1.0], "mixed": [1.0, 0.0, 0.0, 1.0],
    "one_right": [0.0, 0.0, 0.0, 1.0], "single": [1.0], "single0": [0.0], "pair_equal": [0.5, 0.5],
    "tiny": [1.0, 1.0 + 1e-12, 1.0, 1.0], "tiny_zero": [0.0, 1e-12, 0.0, 0.0], "float32_step": [0.5, 0.5 + 2 ** -20, 0.5],
    "graded_equal": [0.1, 0.1, 0.1], "graded_equal7": [0.7, 0.7, 0.7, 0.7, 0.7, 0.7], "graded_mixed": [0.2, 0.5, 0.5],
    "negative": [-1.0, -1.0, -1.0], "negative_mixed": [-1.0, 1.0, -1.0],
}


def check_dapo(out: dict) -> None:
    import verl.trainer.ppo.v1.replay_buffer as rb_mod
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from omegaconf import OmegaConf

    from rlcurate.curation.base import Group
    from rlcurate.curation.dapo import DapoFilter
    from rlcurate.tasks.base import Problem

    buf = ReplayBuffer(trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
                       max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}), refill_fn=lambda k: k,
                       filter_groups_metric="reward", train_batch_size=len(DAPO_GROUPS), gen_batch_size=1)
    uid_of = {name: uuid.uuid4().hex for name in DAPO_GROUPS}  # verl's uids carry no "_"
    rows = {}
    for name, rewards in DAPO_GROUPS.items():  # as _sync_metadata_from_transfer_queue fills them
        buf.finished_keys["train"].add(uid_of[name])
        for s, r in enumerate(rewards):
            scores = torch.zeros(3, dtype=torch.float32)  # the agent loop's rm_scores: float32, reward on the last token
            scores[-1] = r
            rows[f"{uid_of[name]}_{s}_0"] = scores
            buf.partitions["train"][f"{uid_of[name]}_{s}_0"] = {"status": "success"}

    def kv_batch_get(keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        assert select_fields == ["rm_scores"], select_fields
        return list_of_dict_to_tensordict([{"rm_scores": rows[k]} for k in keys])

    rb_mod.tq.kv_batch_get = kv_batch_get  # the store is stubbed; the filter is verl's
    evicted, counts = buf._dapo_filtered_keys("train")
    verl_kept = sorted(n for n in DAPO_GROUPS if uid_of[n] not in evicted)

    class Ctx:
        prompts_per_step = len(DAPO_GROUPS)  # every mixed group fits: compare the keep rule, not the cap

    def rlcurate_kept(cast):
        groups = [Group(index=j, problem=Problem(n, "", ""), prompt="", completions=[None] * len(r),
                        rewards=np.asarray([cast(x) for x in r], dtype=float))
                  for j, (n, r) in enumerate(DAPO_GROUPS.items())]
        return sorted(g.problem.uid for g in DapoFilter().process(Ctx(), groups))

    out["dapo"] = {"verl_kept": verl_kept, "rlcurate_kept": rlcurate_kept(float),
                   "rlcurate_kept_float32": rlcurate_kept(lambda x: float(np.float32(x))),
                   "verl_evicted_values": {str(k): v for k, v in counts.items()}}


# Skipping zero-advantage groups (data.sampler.skip_zero_advantage): verl's own _balance_batch, _compute_advantage
# and policy losses on a batch with flat, mixed, graded, lone and two-turn groups, dense and skipped
SKIP_GROUPS = {"all0": [0.0, 0.0, 0.0, 0.0], "all1": [1.0, 1.0, 1.0, 1.0], "mixed": [1.0, 0.0, 0.0, 1.0],
               "one_right": [0.0, 0.0, 0.0, 1.0], "graded_equal": [0.5, 0.5, 0.5, 0.5], "graded_mixed": [0.2, 0.5, 0.5, 0.5],
               "single": [1.0], "rounded_equal": [0.3] * 6}  # verl's float32 mean of six 0.3 is not 0.3: trained
SKIP_TWO_TURN = ("all1", "mixed")  # session 0 of these groups has two outputs, the reward on both
SKIP_PROMPTS = 10  # one mini-batch of 40 rows holds the dense batch (33 rows and a padding row), as the option needs
SKIP_EXACT = {"algorithm.adv_estimator": "grpo", "data.sampler.skip_zero_advantage": True,
              "data.train_batch_size": SKIP_PROMPTS, "actor_rollout_ref.actor.ppo_mini_batch_size": SKIP_PROMPTS,
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2}


class TensorStore(Store):
    """:class:`Store` that also takes verl's TensorDict puts, returns the fields each row has and clears keys."""

    def __init__(self, rows: dict, batch):
        super().__init__()
        self.rows, self.cleared = rows, []
        self.tags = dict(zip(batch.keys, batch.tags))

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        if fields is not None and not isinstance(fields, list):
            fields = [{f: (fields[f].unbind() if isinstance(fields[f], torch.Tensor) else list(fields[f]))[j]
                       for f in fields.keys()} for j in range(len(keys))]
        super().kv_batch_put(keys, partition_id, fields, tags)
        for j, key in enumerate(keys):
            self.tags.setdefault(key, {}).update(tags[j] if tags else {})
        return KVBatchMeta(partition_id=partition_id, keys=list(keys), tags=[self.tags[k] for k in keys])

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.gets.append(list(keys))
        present = set.intersection(*(set(self.rows[k]) for k in keys))
        names = [f for f in (select_fields or sorted(present)) if f in present]
        return list_of_dict_to_tensordict([{f: self.rows[k][f] for f in names} for k in keys])

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.rows.pop(key)
            self.cleared.append(key)


def skip_batch(rng):
    """One step's trajectories as verl's agent loop leaves them in TransferQueue (and a padding row)."""
    from transfer_queue import KVBatchMeta

    rows, keys, tags, uid_of = {}, [], [], {}
    for g, (name, rewards) in enumerate(SKIP_GROUPS.items()):
        uid_of[name] = uuid.uuid4().hex
        for s, r in enumerate(rewards):
            for o in range(2 if s == 0 and name in SKIP_TWO_TURN else 1):
                length = int(rng.integers(2, 9))
                scores = torch.zeros(length, dtype=torch.float32)
                scores[-1] = r
                keys.append(f"{uid_of[name]}_{s}_{o}")
                tags.append({"status": "success", "seq_len": 8 + length})
                rows[keys[-1]] = {"uid": uid_of[name], "index": 1000 + 7 * g, "rm_scores": scores,
                                  "response_mask": torch.ones(length, dtype=torch.int64)}
    keys.append(f"pad{uuid.uuid4().hex}_0_0")
    tags.append({"status": "success", "seq_len": 2, "is_padding": True})
    rows[keys[-1]] = {"uid": keys[-1].rsplit("_", 2)[0], "index": 1000, "rm_scores": torch.zeros(1),
                      "response_mask": torch.zeros(1, dtype=torch.int64)}
    return rows, KVBatchMeta(partition_id="train", keys=keys, tags=tags), uid_of


def skip_pipeline(trainer, store, batch):
    """verl's _step_once between the reward and the actor update, as the trainer runs it (no workers)."""
    import transfer_queue as tq

    tq.kv_batch_put, tq.kv_batch_get, tq.kv_clear = store.kv_batch_put, store.kv_batch_get, store.kv_clear
    import verl.trainer.ppo.padding_utils as pu

    pu.tq = tq
    metrics = {}
    batch = trainer._balance_batch(batch, metrics=metrics)
    batch = trainer._compute_advantage(batch, metrics=metrics)
    return batch, metrics


def policy_gradient(store, batch, mode, agg, nominal_rows, log_probs):
    """verl's policy loss on the rows of ``batch`` (its engine's global batch information), and its gradient on
    each row's log-probabilities, by key."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    cfg = verl_config(os.devnull, **SKIP_EXACT, **{"actor_rollout_ref.actor.loss_agg_mode": agg,
                                                  "actor_rollout_ref.actor.policy_loss.loss_mode": mode})
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    width = max(len(store.rows[k]["response_mask"]) for k in batch.keys)

    def pad(t):
        return torch.nn.functional.pad(t, (0, width - len(t)))

    leaves = {k: log_probs.get(k, torch.zeros(len(store.rows[k]["response_mask"]))).clone().requires_grad_(True)
              for k in batch.keys}
    mask = torch.stack([pad(store.rows[k]["response_mask"]) for k in batch.keys]).bool()
    adv = torch.stack([pad(store.rows[k]["advantages"].float()) for k in batch.keys])
    new = torch.stack([pad(leaves[k]) for k in batch.keys])
    old = torch.stack([pad(log_probs.get(k, torch.zeros(len(store.rows[k]["response_mask"]))).detach() - 0.05 *
                           torch.arange(len(store.rows[k]["response_mask"]))) for k in batch.keys])
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=nominal_rows,
                                   loss_scale_factor=None)
    loss, _ = get_policy_loss_fn(mode)(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                       loss_agg_mode=agg, config=actor)
    loss.backward()
    return {k: v.grad for k, v in leaves.items()}, float(loss)


def check_skip(out: dict, parquet: str, tokenizer) -> None:
    import copy
    from types import SimpleNamespace

    import rlcurate.interop.verl_v1 as v1
    from rlcurate.interop.verl_skip import plan_skip

    res: dict = {}
    # what would change the update is refused when the trainer is built, one line naming each setting
    try:
        v1.CuratedPPOTrainer(verl_config(parquet, **{"data.sampler.skip_zero_advantage": True}))
        res["refused_defaults"] = ""
    except ValueError as exc:
        res["refused_defaults"] = str(exc)
    try:
        v1.CuratedPPOTrainer(verl_config(parquet, **SKIP_EXACT, **{"actor_rollout_ref.actor.use_kl_loss": True,
                                                                  "actor_rollout_ref.actor.ppo_epochs": 2}))
        res["refused_kl"] = ""
    except ValueError as exc:
        res["refused_kl"] = str(exc)

    rng = np.random.default_rng(5)
    rows, batch, uid_of = skip_batch(rng)
    log_probs = {k: torch.tensor(rng.normal(-1.0, 0.3, len(r["response_mask"])), dtype=torch.float32)
                 for k, r in rows.items()}
    nominal = SKIP_PROMPTS * N_RESP
    runs = {}
    for name, skip in (("dense", False), ("skip", True)):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"):
            cfg = verl_config(parquet, **{**SKIP_EXACT, "data.sampler.skip_zero_advantage": skip,
                                          "actor_rollout_ref.actor.loss_agg_mode": agg})
            trainer = bare_trainer(v1.CuratedPPOTrainer, cfg, tokenizer)
            trainer.global_steps = 1
            trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0, 1]})  # two data-parallel ranks
            store = TensorStore(copy.deepcopy(rows), batch)
            out_batch, metrics = skip_pipeline(trainer, store, copy.deepcopy(batch))
            runs[name, agg] = (store, out_batch, metrics, trainer)
    dense_store, dense_batch, _, _ = runs["dense", "token-mean"]
    skip_store, skip_batch_, skip_metrics, skip_trainer = runs["skip", "token-mean"]
    plan = plan_skip(batch.keys, batch.tags, [float(rows[k]["rm_scores"].sum()) for k in batch.keys],
                     [int(rows[k]["response_mask"].sum()) for k in batch.keys])
    group_of = {u: n for n, u in uid_of.items()}
    real = [k for k in skip_batch_.keys if k in rows]
    res["kept_groups"] = sorted({group_of[k.rsplit("_", 2)[0]] for k in real})
    res["dropped_groups"] = sorted({group_of[u] for u in plan.flat_groups})
    res["skipped_waiting"] = sorted(k for b in skip_trainer._skipped for k in b.keys)
    res["dropped_keys"] = sorted(batch.keys[r] for r in plan.drop)
    res["rows"] = {"dense": len(dense_batch.keys), "skip": len(skip_batch_.keys), "skip_real": len(real),
                   "nominal_rows": nominal,
                   "skip_pads_masked": all(int(skip_store.rows[k]["response_mask"].sum()) == 0
                                           for k in skip_batch_.keys if k not in rows)}
    res["metrics"] = {k: v for k, v in skip_metrics.items() if k.startswith("rlcurate/")}
    res["tokens"] = {"kept": plan.tokens_kept, "dense": plan.tokens_dense}
    # verl's own GRPO gives every dropped row a zero advantage on the dense batch
    res["dropped_dense_advantage_max"] = max(float(dense_store.rows[k]["advantages"].abs().max())
                                             for k in res["dropped_keys"] if k in dense_store.rows)
    res["rounded_equal_dense_advantage"] = max(float(dense_store.rows[k]["advantages"].abs().max()) for k in rows
                                               if k.startswith(uid_of["rounded_equal"]))
    # what the passes cost in tokens: verl's 128-token padding rows replace the dropped rows (here 10-16 tokens each)
    seq = {k: t["seq_len"] for k, t in zip(batch.keys, batch.tags)}
    dense_real = [k for k, t in zip(batch.keys, batch.tags) if not t.get("is_padding", False)]
    pads = {name: [t["seq_len"] for t in b.tags if t.get("is_padding", False)] for name, b in
            (("dense", dense_batch), ("skip", skip_batch_))}
    res["net_token_share"] = {"metric": skip_metrics.get("rlcurate/skip_net_token_share"),
                              "expected": 1 - (sum(seq[k] for k in real) + sum(pads["skip"]))  # the dense batch's
                              / (sum(seq[k] for k in dense_real) + 128 * (-len(dense_real) % nominal)),  # real rows, padded
                              "pad_len": sorted(set(pads["skip"]))}
    # a batch longer than one mini-batch (here 33 rows against 4 x 4): the dense trainer takes several optimizer
    # steps on it, so it is trained whole
    short = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet, **{**SKIP_EXACT, "data.train_batch_size": 4,
                                                                      "actor_rollout_ref.actor.ppo_mini_batch_size": 4}),
                         tokenizer)
    short.global_steps = 1
    short.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0, 1]})
    long_batch, long_metrics = skip_pipeline(short, TensorStore(copy.deepcopy(rows), batch), copy.deepcopy(batch))
    res["too_long"] = {"rows_in": len(batch.keys), "rows_out": len(long_batch.keys),
                       "all_kept": set(batch.keys) <= set(long_batch.keys), "waiting": len(short._skipped),
                       "metrics": {k: v for k, v in long_metrics.items() if k.startswith("rlcurate/")}}
    grads = {}
    for mode in ("vanilla", "gspo"):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"):
            d_store, d_batch, _, _ = runs["dense", agg]
            s_store, s_batch, _, _ = runs["skip", agg]
            gd, ld = policy_gradient(d_store, d_batch, mode, agg, nominal, log_probs)
            gs, ls = policy_gradient(s_store, s_batch, mode, agg, nominal, log_probs)
            kept = [k for k in s_batch.keys if k in rows]
            grads[f"{mode} {agg}"] = {
                "kept_max_diff": max(float((gd[k] - gs[k]).abs().max()) for k in kept),
                "kept_max_grad": max(float(gd[k].abs().max()) for k in kept),
                "dropped_dense_max_grad": max(float(gd[k].abs().max()) for k in res["dropped_keys"] if k in gd),
                "loss_dense": ld, "loss_skip": ls}
    res["gradients"] = grads

    # inside verl's step: the sampler observes the dropped groups too, and they leave TransferQueue after it
    from verl.trainer.ppo.v1 import PPOTrainer

    trainer = bare_trainer(v1.CuratedPPOTrainer, verl_config(parquet, **SKIP_EXACT), tokenizer)
    trainer._init_dataloader()
    trainer.global_steps = 1
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0, 1]})
    trainer.agent_loop_manager = SimpleNamespace(generate_sequences=lambda prompts: None)  # the batch is made above
    store = TensorStore(copy.deepcopy(rows), batch)
    PPOTrainer._step_once = lambda self, metrics, timing_raw, size: skip_pipeline(self, store, copy.deepcopy(batch))[0]
    trainer.step({}, {})
    counts = trainer.train_dataloader.sampler.last_update
    res["step"] = {"observed": {group_of[uid_of[n]]: list(counts.get(g, ())) for g, n in enumerate(SKIP_GROUPS)},
                   "cleared": sorted(store.cleared), "left_in_store": sorted(k for k in res["dropped_keys"] if k in store.rows),
                   "waiting_after": len(trainer._skipped)}
    # the dropped groups are trained as the dense batch trains them (zero advantage): evidence under "trained" too
    trials = {}
    for evidence in ("generated", "trained"):
        cfg = verl_config(parquet, **SKIP_EXACT)
        cfg.data.sampler.strategy_kwargs = {"mu": 0.3, "evidence": evidence}
        trainer = bare_trainer(v1.CuratedPPOTrainer, cfg, tokenizer)
        trainer._init_dataloader()
        trainer.global_steps = 1
        trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0, 1]})
        trainer.agent_loop_manager = SimpleNamespace(generate_sequences=lambda prompts: None)
        store = TensorStore(copy.deepcopy(rows), batch)
        trainer.step({}, {})
        beliefs = trainer.train_dataloader.sampler.selection.selector.beliefs
        trials[evidence] = float((beliefs.alpha + beliefs.beta - 2).sum())
    res["step"]["belief_trials"] = trials
    out["skip"] = res


# SAGE-LIGHT's hints: a pool of hinted arithmetic problems, INSIGHT choosing, rewards a fixed function of the draw
HINT_POOL, HINT_STEPS = 8, 10
HINT_TASK = {"name": "arithmetic", "kwargs": {"style": "chat", "levels": ["add2", "mul2x1"], "n_train": HINT_POOL,
                                              "n_test": 4}}


def hint_reward(step: int, index: int, hinted: bool, session: int) -> float:
    """A response's reward: a fixed function of the prompt it was drawn for (whoever draws it); a hint raises
    the pass rate."""
    rate = min(1.0, (index * 37 % 100) / 300 + 0.4 * hinted)
    return float(np.random.default_rng([step, index, int(hinted), session]).random() < rate)


def hint_parquet(folder: str, task, prompt=None) -> str:
    import datasets

    rows = [{"data_source": "arith", "prompt": (prompt or task.messages)(q), "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": q.answer},
             "extra_info": {"index": 500 + 3 * i, "uid": q.uid, "split": "train"}}
            for i, q in enumerate(task.problems("train"))]
    path = os.path.join(folder, f"hinted{len(os.listdir(folder))}.parquet")
    datasets.Dataset.from_list(rows).to_parquet(path)
    return path


def _hinted_evidence(sampler, seen, levels) -> dict:
    """INSIGHT's trials per prompt against the responses it saw: a hinted group is no evidence by default
    (``hinted_evidence="skip"``), and with ``hinted_evidence="failures"`` its failures count as failed trials
    (chapter 10)."""
    beliefs = getattr(sampler.selection.selector, "beliefs", None)
    if beliefs is None:
        return {}
    unhinted = np.zeros(beliefs.alpha.size)
    hinted_failures = np.zeros(beliefs.alpha.size)
    for step_no, (step, lv) in enumerate(zip(seen, levels), start=1):
        for (i, _), level in zip(step, lv):
            pos = sampler.positions([i])[0]
            if level == 0:
                unhinted[pos] += N_RESP
            else:
                hinted_failures[pos] += sum(1 - hint_reward(step_no, (i - 500) // 3, True, s) for s in range(N_RESP))
    trials = beliefs.alpha + beliefs.beta - 2
    return {"trials_equal_unhinted": bool(np.array_equal(trials, unhinted)),
            "trials_equal_unhinted_and_hinted_failures": bool(np.array_equal(trials, unhinted + hinted_failures)),
            "hinted_responses": int(N_RESP * sum(lv > 0 for step in levels for lv in step)),
            "hinted_failures": int(hinted_failures.sum())}


def check_hints_under_dapo(out: dict, parquet: str, tokenizer) -> None:
    """SAGE-LIGHT's hints under DAPO's filter: verl's own replay buffer classifies each round of finished groups and
    evicts the flat ones, verl's refill fetches (and hints) as many prompts again, and the stand-in generates them,
    until a round evicts nothing (at most four rounds a step). The schedule must see every group generated, the
    evicted all-wrong ones included (their failures raise the prompt's level), as this package's SAGE-LIGHT fed the
    same groups fetch by fetch."""
    from types import SimpleNamespace

    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    import rlcurate.interop.verl_v1 as v1
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Group
    from rlcurate.tasks import get_task

    task = get_task(HINT_TASK["name"], **HINT_TASK["kwargs"])
    problems = task.problems("train")
    hinted = hint_parquet(os.path.dirname(parquet), task)
    hints = {"strategy": "sage_light", "strategy_kwargs": {"hint_mode": "user"}, "task": HINT_TASK["name"],
             "task_kwargs": HINT_TASK["kwargs"]}
    store = TensorStore({}, KVBatchMeta(partition_id="train", keys=[], tags=[]))
    tq.kv_batch_put, tq.kv_batch_get, tq.kv_clear = store.kv_batch_put, store.kv_batch_get, store.kv_clear
    cfg = verl_config(hinted, **{"data.sampler.hints": hints, "data.max_prompt_length": 256,
                                 "data.sampler.strategy": "uniform", "data.sampler.strategy_kwargs": {},
                                 "algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc"})
    trainer = bare_trainer(v1.CuratedPPOTrainer, cfg, tokenizer)
    trainer._init_dataloader()
    trainer.global_steps = 1
    buf = trainer.replay_buffer
    buf.filter_groups_metric = "reward"  # verl's canonical reward (rm_scores): what the stand-in writes

    def reward(step, pos, level, s, again):  # an unhinted prompt of an even position always fails (its groups are
        # evicted); ``again``: the prompt's earlier fetches this step (refills past the whole pool), other draws
        return 0.0 if pos % 2 == 0 and level == 0 else hint_reward(step, pos, level > 0, s + 10 * again)

    class Rollout:  # the agent loop manager: generates what verl submits, one fetch at a time
        def __init__(self):
            self.fetches: list = []
            self.times: dict = {}  # prompt -> fetches this step

        def generate_sequences(self, batch):
            ids = [int(i) for i in batch["index"]]
            raw = batch.get("raw_prompt")
            fetch = []
            for k, (uid, idx) in enumerate(zip(list(batch["uid"]), ids)):
                pos = (idx - 500) // 3
                level = trainer.train_dataloader.sampler.hints.level_of[str(uid)]
                assert (raw[k].data != task.messages(problems[pos])) == (level > 0)
                again = self.times.get(pos, 0)
                self.times[pos] = again + 1
                rewards = [reward(trainer.global_steps, pos, level, s_, again) for s_ in range(N_RESP)]
                for s_, r in enumerate(rewards):
                    key = f"{uid}_{s_}_0"
                    store.rows[key] = {"index": idx, "rm_scores": torch.tensor([0.0, 0.0, r])}
                    buf.partitions["train"][key] = {"status": "success", "seq_len": 3}
                buf.finished_keys["train"].add(uid)
                fetch.append((pos, level, rewards, uid))
            self.fetches.append(fetch)

    trainer.agent_loop_manager = rollout = Rollout()
    steps = []

    def step_once(self, metrics, timing_raw, size):
        for _ in range(4):
            reasons = buf._terminal_eviction_reasons(self.global_steps, "train")  # verl's DAPO classification
            buf._evict_terminal_groups(self.global_steps, "train", reasons)
            if not reasons[1]:
                break
            buf.refill_fn(len(reasons[1]))
        fetches, rollout.fetches, rollout.times = rollout.fetches, [], {}
        steps.append(fetches)
        kept = [k for k in buf.partitions["train"] if k.split("_")[0] in buf.finished_keys["train"]]
        return KVBatchMeta(partition_id="train", keys=kept, tags=[buf.partitions["train"][k] for k in kept])

    PPOTrainer._step_once = step_once
    for _ in range(HINT_STEPS):
        trainer.step({}, {})
        for key in list(buf.partitions["train"]):  # verl clears the trained groups after its metrics
            buf.partitions["train"].pop(key)
        buf.finished_keys["train"].clear()
        trainer.global_steps += 1
    mine = trainer.train_dataloader.sampler.hints

    # this package's SAGE-LIGHT, fed the same groups: a rollout per fetch, every group observed at the step's end
    sage = build_curator("sage_light", hint_mode="user").sampler
    levels_equal, repeats = True, []
    for step_no, fetches in enumerate(steps, start=1):
        groups, times = [], {}
        for fetch in fetches:
            def generate(indices, m, hints=None, hint_levels=None, hint_mode=None):
                out = []
                for i, h, lv in zip(indices, hints, hint_levels):
                    again = times.get(i, 0)
                    times[i] = again + 1
                    out.append(Group(index=i, problem=problems[i], prompt=h or "", completions=[None] * m,
                                     rewards=np.asarray([reward(step_no, i, lv, s_, again) for s_ in range(m)]),
                                     hint_level=lv))
                return out

            ctx = SimpleNamespace(step=step_no, prompts_per_step=len(fetch), group_size=N_RESP, generate=generate,
                                  task=task, problems=problems, tokenizer=None, render=None)
            got = sage.rollout(ctx, [pos for pos, *_ in fetch])
            levels_equal &= [g.hint_level for g in got] == [level for _, level, *_ in fetch]
            groups += got
        sage.observe(None, groups)  # in the order of the fetches: a prompt's later group decides
        by_prompt = {}
        for g in groups:
            by_prompt.setdefault(g.index, []).append(float(g.rewards.mean()))
        repeats += [accs for accs in by_prompt.values() if len(accs) > 1]
    flat_then_hinted = 0  # prompts whose unhinted group was all wrong (evicted) and that came back hinted
    last = {}
    for fetches in steps:
        for fetch in fetches:
            for pos, level, rewards, _ in fetch:
                flat_then_hinted += level > 0 and last.get(pos) == (0, 0.0)
                last[pos] = (level, max(rewards))
    out["hints_under_dapo"] = {
        "refused": "", "levels_equal": levels_equal, "schedule_equal": mine.state_dict() == sage.state_dict(),
        "fetches_per_step": [len(f) for f in steps], "groups": sum(len(f) for fs in steps for f in fs),
        "evicted_uids_left": len(mine.level_of), "flat_then_hinted": int(flat_then_hinted),
        "hinted_groups": sum(level > 0 for fs in steps for f in fs for _, level, *_ in f),
        "cleared_left": len(buf.cleared), "repeats_with_other_accuracy": sum(len(set(a)) > 1 for a in repeats)}


def check_hints(out: dict, parquet: str, tokenizer) -> None:
    """verl's ``step`` fetches, hints and observes; the levels, the hinted raw_prompts, the draws and the beliefs
    must equal this package's SAGE-LIGHT and INSIGHT fed the same rewards."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer

    import rlcurate.interop.verl_v1 as v1
    from rlcurate.curation import build_curator
    from rlcurate.curation.base import Group
    from rlcurate.interop.verl import CurationSampler
    from rlcurate.tasks import get_task

    task = get_task(HINT_TASK["name"], **HINT_TASK["kwargs"])
    problems = task.problems("train")
    folder = os.path.dirname(parquet)
    hinted = hint_parquet(folder, task)
    hints = {"strategy": "sage_light", "strategy_kwargs": {"hint_mode": "user"}, "task": HINT_TASK["name"],
             "task_kwargs": HINT_TASK["kwargs"]}
    res = {}
    # uniform draws revisit every prompt each epoch (4 steps); INSIGHT, with verl fetching one prompt at a time
    # (data.gen_batch_size=1, as verl forces under DAPO), revisits the prompts it finds informative
    for mode, changes in (("uniform", {"data.sampler.strategy": "uniform", "data.sampler.strategy_kwargs": {}}),
                          ("insight_one_per_fetch", {"data.gen_batch_size": 1}),
                          # appendix A2's example: hinted failures counted (the default collapses on a revisited pool)
                          ("insight_hinted_failures", {"data.gen_batch_size": 1, "data.sampler.strategy_kwargs":
                                                       {"mu": 0.3, "hinted_evidence": "failures"}})):
        store = Store()
        tq.kv_batch_put, tq.kv_batch_get = store.kv_batch_put, store.kv_batch_get
        cfg = verl_config(hinted, **{"data.sampler.hints": hints, "data.max_prompt_length": 256, **changes})
        trainer = bare_trainer(v1.CuratedPPOTrainer, cfg, tokenizer)
        trainer._init_dataloader()
        trainer.global_steps = 1
        seen = []  # per step: (prompt id, raw_prompt) as the agent loop receives them

        class Rollout:
            def generate_sequences(self, batch):
                from verl.trainer.ppo.v1.agent_loop_tq import NonTensorStack

                raw = batch.get("raw_prompt")
                assert isinstance(raw, NonTensorStack), type(raw)  # the agent loop reads v[i].data
                ids = [int(i) for i in batch["index"]]
                prompts = [raw[k].data for k in range(len(ids))]
                seen.append(list(zip(ids, prompts)))
                keys, tags = [], []
                for uid, idx, messages in zip(list(batch["uid"]), ids, prompts):
                    pos = (idx - 500) // 3
                    hinted = messages != task.messages(problems[pos])
                    for s in range(N_RESP):
                        keys.append(f"{uid}_{s}_0")
                        tags.append({"status": "success", "seq_len": 2})
                        store.rows[keys[-1]] = {"index": idx, "rm_scores": torch.tensor(
                            [0.0, hint_reward(trainer.global_steps, pos, hinted, s)])}
                self.batch = KVBatchMeta(partition_id="train", keys=keys[::-1], tags=tags[::-1])

        trainer.agent_loop_manager = rollout = Rollout()
        PPOTrainer._step_once = lambda self, metrics, timing_raw, size: rollout.batch
        metrics, levels = [], []
        for _ in range(HINT_STEPS):
            m = {}
            trainer.step(m, {})
            metrics.append({k: v for k, v in m.items() if k.startswith("rlcurate/sage")})
            levels.append(list(trainer.train_dataloader.sampler.hints.step_levels))
            trainer.global_steps += 1
        mine = trainer.train_dataloader.sampler

        # this package's INSIGHT and SAGE-LIGHT on the same rewards
        ref = CurationSampler(trainer.train_dataset, trainer.config.data, batch_size=BATCH)
        sage = build_curator("sage_light", hint_mode="user").sampler
        ref_seen, ref_levels = [], []
        for step in range(1, HINT_STEPS + 1):
            positions = ref.selection.select(BATCH)

            def generate(indices, m, hints=None, hint_levels=None, hint_mode=None):
                return [Group(index=i, problem=problems[i], prompt=h or "", completions=[None] * m,
                              rewards=np.asarray([hint_reward(step, i, lv > 0, s) for s in range(m)]), hint_level=lv)
                        for i, h, lv in zip(indices, hints, hint_levels)]

            from types import SimpleNamespace

            ctx = SimpleNamespace(step=step, prompts_per_step=BATCH, group_size=N_RESP, generate=generate, task=task,
                                  problems=problems, tokenizer=None, render=None)
            groups = sage.rollout(ctx, positions)
            ref_seen.append([(500 + 3 * g.index, task.messages(problems[g.index], g.prompt or None)) for g in groups])
            ref_levels.append([g.hint_level for g in groups])
            ref.observe([500 + 3 * g.index for g in groups for _ in range(N_RESP)],
                        np.concatenate([g.rewards for g in groups]),
                        [g.hint_level for g in groups for _ in range(N_RESP)])
            sage.observe(ctx, groups)
        # a checkpoint of the dataloader holds the schedule; a new trainer restored from it has the same
        state = json.loads(json.dumps(trainer.train_dataloader.state_dict(), default=str))
        again = bare_trainer(v1.CuratedPPOTrainer, cfg, tokenizer)
        again._init_dataloader()
        again.train_dataloader.load_state_dict(trainer.train_dataloader.state_dict())
        iter(again.train_dataloader)  # torchdata hands a restored state to the sampler when iterated
        res[mode] = {"sampler": type(mine).__name__, "loader_batch": trainer.train_dataloader.batch_size,
                     "longest_hinted_prompt": mine.hints.check_prompt_length(tokenizer, 10 ** 6),
                     "same_prompts": seen == ref_seen, "levels": levels, "ref_levels": ref_levels,
                     "hinted_prompts": sum(lv > 0 for step in levels for lv in step),
                     "selection_equal": json.dumps(mine.selection.state_dict(), default=str)
                     == json.dumps(ref.selection.state_dict(), default=str), "observed": mine.selection.observed,
                     "hinted_evidence": _hinted_evidence(mine, ref_seen, ref_levels),
                     "schedule_equal": mine.hints.state_dict() == sage.state_dict(),
                     "uids_left": len(mine.hints.level_of), "metrics": metrics,
                     "state_has_hints": '"hints"' in json.dumps(state),
                     "restored": again.train_dataloader.sampler.hints.state_dict() == mine.hints.state_dict()}

    refused = {}
    cases = {"sage": ({**hints, "strategy": "sage"}, hinted), "no_task": ({k: v for k, v in hints.items() if k != "task"}, hinted),
             "prefix": ({**hints, "strategy_kwargs": {"hint_mode": "prefix"}}, hinted),
             "self_written": ({**hints, "task": "gsm8k", "task_kwargs": {}}, hinted),  # GSM8K has no hint()
             "not_task_prompts": (hints, hint_parquet(folder, task, lambda q: [{"role": "user", "content": q.question}])),
             "unknown_uid": (hints, parquet), "with_dapo": (hints, hinted), "too_long": (hints, hinted)}
    for name, (h, data) in cases.items():
        changes = {"data.sampler.hints": h, "data.max_prompt_length": 64 if name == "too_long" else 256}
        if name == "with_dapo":
            changes["algorithm.filter_groups.enable"] = True
        try:
            bare_trainer(v1.CuratedPPOTrainer, verl_config(data, **changes), tokenizer)._init_dataloader()
            refused[name] = ""
        except ValueError as exc:
            refused[name] = str(exc)
    res["refused"] = refused
    try:  # what the configuration alone rules out is refused when the trainer is built, before the dataset loads
        v1.CuratedPPOTrainer(verl_config(hinted, **{"data.sampler.hints": {**hints, "strategy": "sage"}}))  # no dataset read
        res["sage_refused_at_construction"] = ""
    except ValueError as exc:
        res["sage_refused_at_construction"] = str(exc)
    out["hints"] = res


def main() -> None:
    from rlcurate.models.tiny import build_tiny_tokenizer

    out: dict = {}
    sections = sys.argv[1:] or ["registry", "dataloader", "custom_sampler", "update", "dapo", "dapo_evidence",
                                "refills_past_the_pool", "hints", "hints_under_dapo", "skip"]
    with tempfile.TemporaryDirectory() as folder:
        parquet = make_parquet(folder)
        tokenizer = build_tiny_tokenizer()
        for name in sections:
            if name == "registry":
                check_registry(out)
            elif name == "dapo":
                check_dapo(out)
            else:
                globals()[f"check_{name}"](out, parquet, tokenizer)
    print("RLCURATE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
