"""The GRPO loss and its plumbing (chapter 5)."""

import math

import numpy as np
import pytest
import torch

from rlcurate.curation.base import Group
from rlcurate.tasks.base import Problem
from rlcurate.curation.base import group_advantages
from rlcurate.train import TrainConfig
from rlcurate.train.loss import (
    TrainSample,
    aggregation_coefficients,
    forward_logprobs,
    plan_micro_batches,
    policy_loss,
)



def _samples(rng, n=6, vocab=40):
    out = []
    for i in range(n):
        p = rng.integers(3, vocab, size=rng.integers(3, 9)).tolist()
        c = rng.integers(3, vocab, size=rng.integers(1, 7)).tolist()
        out.append(TrainSample(p, c, float(rng.normal())))
    return out


def test_aggregation_coefficients_sum_to_the_right_normaliser():
    rng = np.random.default_rng(0)
    s = _samples(rng)
    n_tok = sum(len(x.completion_ids) for x in s)
    aggregation_coefficients(s, "token-mean", 8)
    assert sum(float(x.coef.sum()) for x in s) == pytest.approx(1.0)
    aggregation_coefficients(s, "seq-mean-token-mean", 8)
    assert all(float(x.coef.sum()) == pytest.approx(1 / len(s)) for x in s)
    aggregation_coefficients(s, "seq-mean-token-sum-norm", 8)
    assert sum(float(x.coef.sum()) for x in s) == pytest.approx(n_tok / (8 * len(s)))
    with pytest.raises(ValueError, match="loss_agg"):
        aggregation_coefficients(s, "sum", 8)


def test_forward_logprobs_match_a_plain_forward(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    rng = np.random.default_rng(1)
    samples = _samples(rng)
    logp, mask, ent = forward_logprobs(model, samples, temperature=1.0, pad_id=tok.pad_token_id, with_entropy=True)
    for r, s in enumerate(samples):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            full = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        expected = full[len(s.prompt_ids) - 1:, :].gather(1, torch.tensor(s.completion_ids)[:, None]).squeeze(1)
        assert torch.allclose(logp[r, mask[r]].detach(), expected, atol=1e-5)
        assert (ent[r, mask[r]] > 0).all()


def test_ratio_one_gradient_is_reinforce(tiny_model_and_tokenizer):
    """On-policy with no clipping active, the loss gradient is -sum kappa A grad log pi."""
    model, tok = tiny_model_and_tokenizer
    rng = np.random.default_rng(2)
    samples = _samples(rng, n=3)
    aggregation_coefficients(samples, "token-mean", 8)
    model.zero_grad()
    logp, mask, _ = forward_logprobs(model, samples, 1.0, tok.pad_token_id)
    loss, _ = policy_loss(logp, mask, samples, 0.2, 0.28, 0.0)
    loss.backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logp, mask, _ = forward_logprobs(model, samples, 1.0, tok.pad_token_id)
    adv = torch.tensor([s.advantage for s in samples])[:, None]
    coef = torch.zeros_like(logp)
    for r, s in enumerate(samples):
        coef[r, mask[r]] = s.coef
    (-(adv * coef * logp * mask).sum()).backward()
    g2 = [p.grad.clone() for p in model.parameters()]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g2))


def test_clipping_stops_the_gradient_outside_the_trust_region(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    s = TrainSample([5, 6, 7], [8, 9], advantage=1.0)
    aggregation_coefficients([s], "token-mean", 4)
    logp, mask, _ = forward_logprobs(model, [s], 1.0, tok.pad_token_id)
    s.old_logprobs = (logp[0, mask[0]].detach() - 1.0)  # ratio = e > 1 + clip_high
    model.zero_grad()
    loss, st = policy_loss(logp, mask, [s], 0.2, 0.28, 0.0)
    loss.backward()
    assert st["clipped_sum"] == 2
    assert all(p.grad is None or float(p.grad.abs().max()) == 0 for p in model.parameters())


def test_kl_term_is_zero_at_the_reference(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    s = TrainSample([5, 6, 7], [8, 9, 10], advantage=0.0)
    aggregation_coefficients([s], "token-mean", 4)
    logp, mask, _ = forward_logprobs(model, [s], 1.0, tok.pad_token_id)
    s.ref_logprobs = logp[0, mask[0]].detach()
    loss, st = policy_loss(logp, mask, [s], 0.2, 0.28, 0.1)
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-7) and st["kl_ref_sum"] == pytest.approx(0.0, abs=1e-7)


def test_kl_term_off_the_reference_is_k3_scaled_by_its_coefficient(tiny_model_and_tokenizer):
    """Half a nat below the policy on every token: k3 = e^q - q - 1 at q = -0.5 per token, added to the loss in
    proportion to kl_coef (with advantage 0 the policy term is 0, so the loss is the KL term alone)."""
    model, tok = tiny_model_and_tokenizer
    s = TrainSample([5, 6, 7], [8, 9, 10], advantage=0.0)
    aggregation_coefficients([s], "token-mean", 4)
    logp, mask, _ = forward_logprobs(model, [s], 1.0, tok.pad_token_id)
    s.ref_logprobs = logp[0, mask[0]].detach() - 0.5
    losses = {c: policy_loss(logp, mask, [s], 0.2, 0.28, c) for c in (0.0, 0.1, 0.2)}
    k3 = math.exp(-0.5) + 0.5 - 1.0
    assert losses[0.1][1]["kl_ref_sum"] == pytest.approx(3 * k3, rel=1e-5)
    assert float(losses[0.0][0].detach()) == pytest.approx(0.0, abs=1e-7)
    assert float(losses[0.1][0].detach()) > 1e-3
    assert float(losses[0.2][0].detach()) == pytest.approx(2 * float(losses[0.1][0].detach()), rel=1e-5)


def test_micro_batches_cover_all_samples_and_respect_the_budget():
    rng = np.random.default_rng(3)
    s = _samples(rng, n=20)
    plan = plan_micro_batches(s, token_budget=40)
    assert sorted(i for mb in plan for i in mb) == list(range(20))
    for mb in plan:
        if len(mb) > 1:
            assert max(s[i].length for i in mb) * len(mb) <= 40


def _group(rewards, baseline=None, pool=None, weight=1.0):
    return Group(index=0, problem=Problem("u", "q", "a"), prompt="p", completions=[None] * len(rewards),
                 rewards=np.asarray(rewards, float), baseline=baseline, pool_size=pool, weight=weight)


def test_group_advantages():
    r = [1, 0, 0, 0]
    assert np.allclose(group_advantages(_group(r), "drgrpo", 1e-6), np.array(r) - 0.25)
    assert np.allclose(group_advantages(_group(r, baseline=0.1), "drgrpo", 1e-6), np.array(r) - 0.1)
    assert np.allclose(group_advantages(_group(r, weight=2.0), "rloo", 1e-6), 2 * (np.array(r) - [0, 1 / 3, 1 / 3, 1 / 3]))
    a = group_advantages(_group(r), "grpo", 1e-6)
    assert np.allclose(a, (np.array(r) - 0.25) / (np.std(r, ddof=1) + 1e-6))
    pooled = group_advantages(_group([1, 0], baseline=0.1, pool=40), "grpo", 1e-6)
    std = np.sqrt(0.1 * 0.9 * 40 / 39)
    assert np.allclose(pooled, (np.array([1, 0]) - 0.1) / (std + 1e-6), rtol=1e-5)
    assert np.all(group_advantages(_group([1, 1, 1]), "grpo", 1e-6) == 0)


def test_config_load_overrides_and_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 5\nstrategy: uniform\ntask_kwargs: {levels: [add2]}\n")
    c = TrainConfig.load(f, ["lr=3e-4", "task_kwargs.n_train=10", "group_size=4"])
    assert c.steps == 5 and c.lr == 3e-4 and c.task_kwargs == {"levels": ["add2"], "n_train": 10} and c.group_size == 4
    with pytest.raises(ValueError, match="unknown key"):
        TrainConfig.load(f, ["grop_size=4"])
    with pytest.raises(ValueError, match="group_size"):
        TrainConfig.load(f, ["group_size=0"])
    with pytest.raises(ValueError, match="loss_agg"):
        TrainConfig(loss_agg="sum")
    with pytest.raises(ValueError, match="not found"):
        TrainConfig.load(tmp_path / "missing.yaml")
    c.save(tmp_path / "out.json")
    assert TrainConfig.from_dict(__import__("json").loads((tmp_path / "out.json").read_text())) == c


def test_every_config_field_is_documented():
    import dataclasses

    from rlcurate.train.config import field_docs

    docs = field_docs()
    missing = [f.name for f in dataclasses.fields(TrainConfig) if not docs.get(f.name)]
    assert not missing, f"fields without a docstring: {missing}"
