"""Not training zero-advantage rows in TRL's GRPOTrainer (``rlcurate.interop.trl_skip``, appendix A2).

The plan on synthetic micro-batches (which rows and columns leave, the factor per loss type, the refusals), the
gradient on TRL 1.16's own ``_compute_loss`` for every loss type the mixin accepts, and one optimizer step of TRL's
loop with and without skipping, which must move the tiny model alike.
"""

from __future__ import annotations

import copy
import hashlib
import warnings

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rlcurate.interop.trl_skip import (SCALE_OF_LOSS, ZeroAdvantageSkipping, advantage_scale,  # noqa: E402
                                       inexact_settings, pack, refuse_inexact, rows_needed,
                                       signal_rows)


class Skipping(ZeroAdvantageSkipping, GRPOTrainer):
    """The documented way to add the skip to a GRPOTrainer."""


def _micro_batch(n=6, prompt=5, width=7, vocab=40, per_token=False, tool=False, seed=0):
    """A micro-batch as TRL builds it: left-padded prompts, right-padded completions; rows 0 and 3 have a zero
    advantage, row 4 an empty loss mask (a truncated completion masked out), the others signal."""
    g = torch.Generator().manual_seed(seed)
    prompt_mask = torch.ones(n, prompt, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_mask[5, :1] = 0
    lengths = torch.tensor([7, 3, 5, 7, 6, 2])[:n]
    completion_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    completion_mask[4] = 0
    advantages = torch.randn(n, generator=g)
    advantages[[0, 3]] = 0.0
    if per_token:
        advantages = advantages[:, None] * torch.rand(n, width, generator=g)
    batch = {"prompt_ids": torch.randint(3, vocab, (n, prompt), generator=g) * prompt_mask,
             "prompt_mask": prompt_mask,
             "completion_ids": torch.randint(3, vocab, (n, width), generator=g) * completion_mask,
             "completion_mask": completion_mask, "advantages": advantages,
             "num_items_in_batch": torch.tensor(float(3 * completion_mask.sum()))}
    if tool:
        batch["tool_mask"] = torch.ones(n, width, dtype=torch.long)
        batch["tool_mask"][2, 1:3] = 0
    return batch


def test_the_rows_without_signal_and_the_padding_they_leave_go():
    batch = _micro_batch()
    (out,), count = pack([batch], "dapo")
    assert out["prompt_ids"].shape == (3, 5) and torch.equal(out["prompt_ids"], batch["prompt_ids"][[1, 2, 5]])
    # the longest kept completion is 5 tokens: columns 5 and 6 were padding on every kept row
    assert out["completion_ids"].shape == (3, 5)
    assert torch.equal(out["completion_mask"], batch["completion_mask"][[1, 2, 5], :5])
    assert torch.equal(out["advantages"], batch["advantages"][[1, 2, 5]])  # dapo: factor 1
    assert out["num_items_in_batch"] is batch["num_items_in_batch"]
    assert (count.rows, count.dropped_rows) == (6, 3)
    assert count.loss_tokens == 7 + 3 + 5 + 7 + 2 and count.dropped_loss_tokens == 7 + 7
    assert count.positions == 6 * 12 and count.dropped_positions == 6 * 12 - 3 * 10


@pytest.mark.parametrize("loss_type", sorted(SCALE_OF_LOSS))
def test_the_kept_advantages_carry_the_dense_normaliser(loss_type):
    batch = _micro_batch(per_token=True, tool=True)
    (out,), _ = pack([batch], loss_type)
    mask = batch["completion_mask"] * batch["tool_mask"]
    factor = {"batch": 1.0, "rows": 3 / 6, "tokens": float(mask[[1, 2, 5]].sum()) / float(mask.sum())}[SCALE_OF_LOSS[loss_type]]
    assert factor == advantage_scale(loss_type, 6, 3, float(mask.sum()), float(mask[[1, 2, 5]].sum()))
    assert torch.allclose(out["advantages"], batch["advantages"][[1, 2, 5], :5] * factor, rtol=0, atol=0)
    assert torch.equal(out["tool_mask"], batch["tool_mask"][[1, 2, 5], :5])


def test_a_micro_batch_without_signal_keeps_its_cheapest_row_and_an_unknown_input_is_named():
    batch = _micro_batch()
    batch["advantages"] = torch.zeros(6)
    assert rows_needed([batch]) == 1
    (out,), count = pack([batch], "grpo")
    # the row that attends to the fewest positions: row 4 (5 prompt tokens, its completion masked out) before
    # row 1 (3 prompt and 3 completion tokens); a completion column remains
    assert torch.equal(out["prompt_ids"], batch["prompt_ids"][[4]]) and count.dropped_rows == 5
    assert out["completion_ids"].shape == (1, 1) and float(out["advantages"].abs().sum()) == 0.0
    with pytest.raises(KeyError, match="pixel_values"):
        pack([{**_micro_batch(), "pixel_values": torch.zeros(4, 3)}], "dapo")


def test_micro_batches_are_packed_again_by_length_with_the_places_other_processes_need():
    first, second = _micro_batch(seed=0), _micro_batch(seed=1)
    second["advantages"][[1, 2]] = 0.0  # rows with signal: 1, 2, 5 of the first and 5 of the second
    assert rows_needed([first, second]) == 2
    out, count = pack([first, second], "grpo")
    # the longest rows together (row 2 of the first: 10 positions; row 5 of either: 6), and 2 of 6 rows' weight each
    assert [len(b["advantages"]) for b in out] == [2, 2] and count.dropped_rows == 8
    assert torch.equal(out[0]["prompt_ids"], first["prompt_ids"][[1, 2]])
    assert torch.equal(out[1]["prompt_ids"], torch.cat([first["prompt_ids"][[5]], second["prompt_ids"][[5]]]))
    assert torch.equal(out[1]["advantages"], torch.stack([first["advantages"][5], second["advantages"][5]]) * (2 / 6))
    assert out[1]["completion_ids"].shape[1] == 2  # both completions are two tokens long
    # another process needs 3 places: the cheapest rows without signal fill the two left (zero gradient)
    out, count = pack([first, second], "grpo", rows_per_batch=3)
    assert [len(b["advantages"]) for b in out] == [3, 3] and count.dropped_rows == 6
    assert sum(int((~signal_rows(b)).sum()) for b in out) == 2
    with pytest.raises(ValueError, match="no place for 2 rows with signal"):
        pack([first, second], "grpo", rows_per_batch=1)


def test_the_settings_that_would_change_the_update_are_refused_in_one_line():
    ok = GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False)
    assert inexact_settings(ok) == []
    bad = GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False, beta=0.04, entropy_coef=0.01, top_entropy_quantile=0.2,
                     loss_type="vespo")
    reasons = inexact_settings(bad)
    assert [r.split("=")[0] for r in reasons] == ["beta", "entropy_coef", "top_entropy_quantile", "loss_type"]
    with pytest.raises(ValueError) as e:
        refuse_inexact(bad)
    assert "\n" not in str(e.value) and "beta=0.04" in str(e.value) and "vespo" in str(e.value)
    adaptive = GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False, use_adaptive_entropy=True)
    assert inexact_settings(adaptive)[0].startswith("use_adaptive_entropy=True")
    # refused before TRL loads the model (the path does not exist)
    with pytest.raises(ValueError, match="beta=0.04"):
        Skipping(model="/nonexistent/model", reward_funcs=lambda **k: [], args=bad, train_dataset=[])
    with pytest.raises(ValueError, match="expected True or False"):
        Skipping(model="/nonexistent/model", reward_funcs=lambda **k: [], args=ok, skip_zero_advantage="yes")
    uneven = GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False, gradient_accumulation_steps=2,
                        steps_per_generation=3)
    assert inexact_settings(uneven)[0].startswith("gradient_accumulation_steps=2 with steps_per_generation=3")
    for accumulation, split in ((1, 4), (4, 2), (3, 3)):  # one divides the other: each step trains whole windows
        assert inexact_settings(GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, bf16=False,
                                           gradient_accumulation_steps=accumulation,
                                           steps_per_generation=split)) == []


def test_settings_passed_by_position_and_dropout_are_refused_once_the_model_loads(tiny_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    bad = _config(tmp_path, per_device_train_batch_size=4, beta=0.04)
    with pytest.raises(ValueError, match="beta=0.04"):  # GRPOConfig as GRPOTrainer's third positional argument
        Skipping(str(tiny_checkpoint), lambda completions, **k: [0.0] * len(completions), bad,
                 train_dataset=_dataset(tok), processing_class=tok)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, attention_dropout=0.1)
    with pytest.raises(ValueError, match=r"without dropout .*self_attn.attention_dropout=0.1"):
        Skipping(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                 args=_config(tmp_path, per_device_train_batch_size=4), train_dataset=_dataset(tok),
                 processing_class=tok)



def test_a_router_auxiliary_loss_and_nn_dropout_are_refused_once_the_model_loads(tiny_checkpoint, tmp_path):
    """A mixture of experts whose load-balancing loss is on (taken over every token present, so it changes with
    the rows trained) and an ``nn.Dropout`` with p > 0 are refused; each accepted once the setting the message
    names is applied (``router_aux_loss_coef=0.0``; ``disable_dropout=True``, which TRL applies on loading)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rlcurate.interop.trl_skip import active_dropout

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    common = dict(reward_funcs=lambda completions, **k: [0.0] * len(completions), train_dataset=_dataset(tok),
                  processing_class=tok)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             moe_intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                             router_aux_loss_coef=0.001))
    with pytest.raises(ValueError, match="without a router auxiliary loss .*router_aux_loss_coef=0.0"):
        Skipping(model=moe, args=_config(tmp_path, per_device_train_batch_size=4), **common)
    assert Skipping(model=moe, args=_config(tmp_path, per_device_train_batch_size=4, router_aux_loss_coef=0.0),
                    **common).skip_zero_advantage
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    model.model.extra_dropout = torch.nn.Dropout(0.1)
    model.model.idle_dropout = torch.nn.Dropout(0.0)
    assert active_dropout(model) == ["model.extra_dropout (p=0.1)"]
    with pytest.raises(ValueError, match=r"without dropout .*model\.extra_dropout \(p=0\.1\).*disable_dropout=True"):
        Skipping(model=model, args=_config(tmp_path, per_device_train_batch_size=4), **common)
    trainer = Skipping(model=model, args=_config(tmp_path, per_device_train_batch_size=4, disable_dropout=True),
                       **common)
    assert active_dropout(trainer.model) == []

# ------------------------------------------------------------------------------------- TRL's own loss
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    return save_tiny(build_tiny_model(seed=0), build_tiny_tokenizer(), tmp_path_factory.mktemp("tiny") / "ckpt")


def _dataset(tok):
    from datasets import Dataset

    from rlcurate.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(levels=["add2", "add3"], n_train=12, n_test=2, seed=0)
    return Dataset.from_dict({"prompt": [task.render(p, tok) for p in task.problems("train")]})


def _config(tmp_path, **extra):
    extra = {"max_steps": 1, "beta": 0.0, **extra}
    return GRPOConfig(output_dir=str(tmp_path / "trl"), num_generations=4, max_completion_length=6,
                      temperature=1.0, top_k=0, top_p=1.0, use_cpu=True, bf16=False, fp16=False,
                      use_vllm=False, report_to="none", logging_steps=1, disable_tqdm=True, seed=0,
                      gradient_checkpointing=False, save_strategy="no", **extra)


@pytest.fixture(scope="module")
def trainer(tiny_checkpoint, tmp_path_factory):
    from transformers import AutoTokenizer

    warnings.filterwarnings("ignore", category=FutureWarning)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    t = Skipping(model=str(tiny_checkpoint), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                 args=_config(tmp_path_factory.mktemp("loss"), per_device_train_batch_size=4),
                 train_dataset=_dataset(tok), processing_class=tok)
    t.model.train()
    t.current_gradient_accumulation_steps = 2
    return t


def _loss_and_grads(trainer, model, batches):
    """The summed loss of ``batches`` (accumulated micro-batches) and its gradient, on a copy of ``model``."""
    model = copy.deepcopy(model)
    total = 0.0
    for batch in batches:
        loss = trainer._compute_loss(model, batch)
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad for p in model.parameters() if p.grad is not None]


CASES = [(loss, "token", False) for loss in sorted(SCALE_OF_LOSS) if loss != "luspo"] + [
    ("luspo", "sequence", False), ("grpo", "sequence", False), ("dapo", "token", True), ("bnpo", "token", True),
    ("grpo", "token", True)]


@pytest.mark.parametrize("loss_type,level,per_token", CASES)
def test_the_gradient_on_trls_own_loss_is_the_dense_batchs(trainer, loss_type, level, per_token):
    """Two micro-batches of one generation batch, accumulated, against the same packed again without their rows
    that carry no signal: every row's ratio away from 1 (old log-probabilities perturbed) so that clipping acts;
    per-token advantages (DRO's weights) and a tool mask in the per-token cases."""
    trainer.loss_type, trainer.importance_sampling_level = loss_type, level
    vocab = trainer.model.config.vocab_size
    dense = [_micro_batch(vocab=vocab, per_token=per_token, tool=per_token, seed=seed) for seed in (1, 3)]
    dense[1]["advantages"][[1, 2]] = 0.0
    for batch in dense:
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1), batch["completion_ids"].shape[1])
        batch["old_per_token_logps"] = logps + 0.3 * torch.randn(logps.shape,
                                                                 generator=torch.Generator().manual_seed(2))
    packed, count = pack(dense, loss_type)
    assert count.dropped_rows == 8 and [len(b["advantages"]) for b in packed] == [2, 2]
    (dense_loss, dense_grads), (skip_loss, skip_grads) = (_loss_and_grads(trainer, trainer.model, batches)
                                                          for batches in (dense, packed))
    assert skip_loss == pytest.approx(dense_loss, rel=1e-5, abs=1e-8)
    scale = max(float(g.abs().max()) for g in dense_grads)
    assert scale > 0 and len(dense_grads) == len(skip_grads)
    for a, b in zip(dense_grads, skip_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6 * scale)


# ------------------------------------------------------------------------------------- TRL's loop
def prompt_is_easy(prompt: str) -> bool:
    return hashlib.blake2b(prompt.encode(), digest_size=8).digest()[0] % 2 == 0


def reward(prompts, completions, **kwargs):
    """1 for every completion of an 'easy' prompt (its group has no signal); a fair coin per completion otherwise."""
    return [1.0 if prompt_is_easy(p) else float(hashlib.blake2b(f"{p}\x00{c}".encode(), digest_size=8).digest()[0] & 1)
            for p, c in zip(prompts, completions)]


class Recording(Skipping):
    def __init__(self, *args, **kwargs):
        self.micro_batches = []
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model, inputs):
        self.micro_batches.append({k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return super()._compute_loss(model, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type,accumulation,steps,iterations", [("dapo", 2, 1, 1), ("grpo", 2, 1, 1),
                                                                     ("grpo", 1, 2, 1), ("dapo", 2, 2, 2)])
def test_one_step_of_trls_loop_moves_the_model_as_dense_training_does(tiny_checkpoint, tmp_path, loss_type,
                                                                       accumulation, steps, iterations):
    """Four groups of four per generation batch in two micro-batches, accumulated into one optimizer step or
    trained as two (each micro-batch packed within its own step), SGD (its step is the gradient, so the parameters'
    change compares the gradients): the same completions and rewards, fewer rows trained. With
    ``num_iterations=2`` the packed micro-batches are trained twice, the second time against the old
    log-probabilities taken at generation (the ratio away from 1)."""
    from transformers import AutoTokenizer

    warnings.filterwarnings("ignore", category=FutureWarning)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    ds = _dataset(tok)
    moved, runs = [], []
    for skip in (False, True):
        cfg = _config(tmp_path / str(skip), per_device_train_batch_size=8, gradient_accumulation_steps=accumulation,
                      steps_per_generation=2, loss_type=loss_type, optim="sgd", learning_rate=1.0,
                      lr_scheduler_type="constant", max_grad_norm=0.0, max_steps=steps, num_iterations=iterations)
        t = Recording(model=str(tiny_checkpoint), reward_funcs=reward, args=cfg, train_dataset=ds,
                      processing_class=tok, skip_zero_advantage=skip)
        before = [p.detach().clone() for p in t.model.parameters()]
        t.train()
        moved.append([p.detach() - b for p, b in zip(t.model.parameters(), before)])
        runs.append(t)
    dense, skipping = runs
    # the same completions were generated and trained: every kept row is one of the dense run's rows
    rows = lambda t: {tuple(r[m.bool()].tolist()) for b in t.micro_batches for r, m in zip(b["completion_ids"],
                                                                                             b["completion_mask"])}
    assert rows(skipping) <= rows(dense)
    n_dense = sum(len(b["advantages"]) for b in dense.micro_batches)
    n_kept = sum(len(b["advantages"]) for b in skipping.micro_batches)
    zero = sum(int((b["advantages"] == 0).sum()) for b in dense.micro_batches)
    assert n_dense == 16 * iterations and 0 < zero < n_dense and n_kept == n_dense - zero + sum(
        int((b["advantages"] == 0).all()) for b in skipping.micro_batches)
    if iterations > 1:  # the second pass is the first's micro-batches again, against the generation's log-probs
        half = len(skipping.micro_batches) // 2
        first, second = skipping.micro_batches[:half], skipping.micro_batches[half:]
        assert all(torch.equal(a["completion_ids"], b["completion_ids"]) for a, b in zip(first, second))
        assert all(torch.equal(a["old_per_token_logps"], b["old_per_token_logps"]) for a, b in zip(first, second))
    logged = next(h for h in skipping.state.log_history if "rlcurate/skip_rows" in h)
    assert logged["rlcurate/skip_rows"] == pytest.approx((n_dense - n_kept) / n_dense)
    assert logged["rlcurate/skip_inexact"] == 0 and 0 < logged["rlcurate/skip_padded_token_share"] < 1
    scale = max(float(d.abs().max()) for d in moved[0])
    assert scale > 0
    for a, b in zip(*moved):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale)
