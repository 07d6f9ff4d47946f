"""Encoding each prompt of a GRPO group once in the training forward pass (chapter 5; the speed-up is
measured in appendix A1): same log-probabilities, entropies and gradients as the unshared layout."""

import numpy as np
import pytest
import torch

from rlcurate.policy.batching import TrainSample, plan_micro_batches
from rlcurate.policy.scoring import _can_share_prompts, forward_logprobs
from rlcurate.train.loss import aggregation_coefficients, policy_loss



def _groups(rng, n_prompts=3, G=4, vocab=50):
    """G samples per prompt; prompts and completions of different lengths, interleaved in the list."""
    prompts = [rng.integers(4, vocab, size=rng.integers(1, 9)).tolist() for _ in range(n_prompts - 1)]
    prompts.append([int(rng.integers(4, vocab))])  # a one-token prompt
    out = []
    for g in range(G):
        for p in prompts:
            c = rng.integers(4, vocab, size=rng.integers(1, 8)).tolist()
            out.append(TrainSample(list(p), c, float(rng.normal())))
    return out


def _loss_and_grads(model, samples, pad_id, share):
    aggregation_coefficients(samples, "token-mean", 8)
    model.zero_grad()
    logp, mask, ent = forward_logprobs(model, samples, 0.7, pad_id, with_entropy=True, share_prompts=share)
    loss, _ = policy_loss(logp, mask, samples, 0.2, 0.28, 0.0)
    loss.backward()
    return logp.detach(), mask, ent, float(loss.detach()), [p.grad.clone() for p in model.parameters()]


def test_shared_prompts_give_the_same_logprobs_entropies_and_gradients(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    model.train()
    samples = _groups(np.random.default_rng(0))
    assert _can_share_prompts(model, samples)
    a = _loss_and_grads(model, samples, tok.pad_token_id, share=False)
    b = _loss_and_grads(model, samples, tok.pad_token_id, share=True)
    assert torch.equal(a[1], b[1])  # same right-aligned layout
    assert torch.allclose(a[0][a[1]], b[0][b[1]], atol=1e-5)
    assert torch.allclose(a[2][a[1]], b[2][b[1]], atol=1e-5)
    assert a[3] == pytest.approx(b[3], abs=1e-6)
    for ga, gb in zip(a[4], b[4]):
        assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-4)


def _nodes_named(tensor, name):
    """How many nodes of ``tensor``'s backward graph are of type ``name``."""
    seen, stack, count = set(), [tensor.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == name
        stack.extend(n for n, _ in node.next_functions)
    return count


def test_the_shared_layout_looks_the_embedding_matrix_up_once(tiny_model_and_tokenizer):
    """Three decoder calls (a common prefix, the prompts, the completions), one dense embedding gradient: the
    backward graph holds one embedding lookup, the gradients are the unshared layout's, and no hook is left on
    the module, after a call with gradients or without."""
    import warnings

    model, tok = tiny_model_and_tokenizer
    model.train()
    prefix = list(range(4, 20))  # 16 tokens every prompt begins with: encoded once
    samples = [TrainSample(prefix + p, c, float(a)) for a, (p, c) in
               enumerate([([21, 22], [23, 24, 25]), ([26], [27, 28])] * 2)]
    aggregation_coefficients(samples, "token-mean", 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a non-contiguous tensor handed to searchsorted
        logp, mask, _ = forward_logprobs(model, samples, 1.0, tok.pad_token_id)
    assert _nodes_named(logp, "EmbeddingBackward0") == 1
    assert not model.get_input_embeddings()._forward_hooks
    shared = _loss_and_grads(model, samples, tok.pad_token_id, share=True)
    unshared = _loss_and_grads(model, samples, tok.pad_token_id, share=False)
    assert torch.allclose(shared[0][mask], unshared[0][mask], atol=1e-5)
    for ga, gb in zip(shared[4], unshared[4]):
        assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        again, _, _ = forward_logprobs(model, samples, 1.0, tok.pad_token_id)
    assert torch.allclose(again[mask], logp.detach()[mask], atol=1e-6)
    assert not model.get_input_embeddings()._forward_hooks


def test_sharing_is_skipped_when_it_cannot_help_or_be_exact(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    distinct = [TrainSample([5, 6, 7], [8], 0.0), TrainSample([5, 6], [9], 0.0)]
    assert not _can_share_prompts(model, distinct)
    sliding = type("Cfg", (), {"layer_types": ["full_attention", "sliding_attention"]})()
    assert not _can_share_prompts(type("M", (), {"config": sliding})(), [TrainSample([5], [8], 0.0)] * 2)


def test_micro_batches_keep_groups_together():
    rng = np.random.default_rng(1)
    samples = _groups(rng, n_prompts=5, G=4)
    plan = plan_micro_batches(samples, token_budget=10**6)
    assert len(plan) == 1
    order = plan[0]
    keys = [tuple(samples[i].prompt_ids) for i in order]
    # each prompt's samples are contiguous
    seen = []
    for k in keys:
        if not seen or seen[-1] != k:
            assert k not in seen
            seen.append(k)
    # distinct prompts: the historical order (longest first, ties by index)
    distinct = [TrainSample([i, 7, 8][: 1 + i % 3], [9] * (1 + i % 4), 0.0) for i in range(3, 12)]
    assert plan_micro_batches(distinct, 10**6)[0] == sorted(range(9), key=lambda i: (-distinct[i].length, i))


def _plain_logprobs(model, s):
    """Log-probabilities of ``s``'s completion from one unbatched forward pass of the whole sequence."""
    ids = torch.tensor([s.prompt_ids + s.completion_ids])
    with torch.no_grad():
        full = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    return full[len(s.prompt_ids) - 1:].gather(1, torch.tensor(s.completion_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("max_len", [1, 6])
def test_both_layouts_match_an_unbatched_forward(tiny_model_and_tokenizer, share, max_len):
    """Neither layout feeds a row's last token (its logits predict nothing); the log-probabilities are
    still those of a full unbatched forward pass, one-token completions included."""
    model, tok = tiny_model_and_tokenizer
    rng = np.random.default_rng(max_len)
    prompts = [rng.integers(4, 50, size=n).tolist() for n in (1, 3, 7)]
    samples = [TrainSample(list(p), rng.integers(4, 50, size=rng.integers(1, max_len + 1)).tolist(), 1.0)
               for _ in range(3) for p in prompts]
    with torch.no_grad():
        logp, mask, ent = forward_logprobs(model, samples, 1.0, tok.pad_token_id, with_entropy=True,
                                           share_prompts=share)
    assert mask.shape[1] == max(len(s.completion_ids) for s in samples)
    for r, s in enumerate(samples):
        assert torch.allclose(logp[r, mask[r]], _plain_logprobs(model, s), atol=1e-5)
        assert (ent[r, mask[r]] > 0).all()


@pytest.mark.parametrize("share", [False, True])
def test_chunked_output_layer_gives_the_same_logprobs_and_gradients(tiny_model_and_tokenizer, share, monkeypatch):
    """The output layer applied one position per checkpointed chunk (as a 150k vocabulary is) gives the
    log-probabilities, entropies and gradients of one chunk for the whole micro-batch."""
    from rlcurate.policy import scoring

    model, tok = tiny_model_and_tokenizer
    model.train()
    samples = _groups(np.random.default_rng(3))
    whole = _loss_and_grads(model, samples, tok.pad_token_id, share=share)
    vocab = model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(scoring, "LOGIT_CHUNK_BYTES", 4 * vocab)  # one position per chunk
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    chunked = _loss_and_grads(model, samples, tok.pad_token_id, share=share)
    assert len(calls) == int(whole[1].sum())  # one checkpointed chunk per completion token
    assert torch.equal(whole[1], chunked[1])
    assert torch.allclose(whole[0], chunked[0], atol=1e-6)
    assert torch.allclose(whole[2], chunked[2], atol=1e-6)
    for ga, gb in zip(whole[4], chunked[4]):
        assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-4)


def test_a_model_whose_logits_are_not_its_output_layer_is_refused():
    from rlcurate.policy.scoring import split_head

    cfg = type("Cfg", (), {"final_logit_softcapping": 30.0})()
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        split_head(type("M", (), {"config": cfg})())


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tiny_model_and_tokenizer):
    """``gradient_checkpointing: true`` recomputes each layer in the backward pass (no prompt cache to
    share in training mode, so the unshared layout is used): the same numbers."""
    import copy

    model, tok = tiny_model_and_tokenizer
    plain = copy.deepcopy(model).train()
    ckpt = copy.deepcopy(model).train()
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    samples = _groups(np.random.default_rng(5))
    a = _loss_and_grads(plain, samples, tok.pad_token_id, share=True)
    b = _loss_and_grads(ckpt, samples, tok.pad_token_id, share=True)
    assert torch.allclose(a[0][a[1]], b[0][b[1]], atol=1e-5)
    assert a[3] == pytest.approx(b[3], abs=1e-6)
    for ga, gb in zip(a[4], b[4]):
        assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-4)
