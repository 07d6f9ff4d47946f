"""Scoring token sequences with a causal language model (chapters 3, 5 and 8).

Three questions a step asks of the model being trained, each answered in one place:

- :func:`forward_logprobs`: log pi(a_t | x, a_<t) of every completion token (the loss, chapter 5);
- :func:`sequence_logprobs`: the same for given continuations without gradients (DRO's
  teacher-forced reference answer, chapter 8), and :func:`sequence_logprobs_and_ranks` with each
  token's rank under the policy as well (DRO's dataset filter);
- :func:`grad_norms`: ||grad log pi(y | x)|| per completion (GVM's G_i, chapter 3).

The output layer is applied in chunks of positions (:func:`token_logprobs`): for a 150k-token
vocabulary the fp32 log-softmax of one position is 0.6 MB, so a micro-batch of 25k positions would hold
15 GB of it for the backward pass. Each chunk's logits are recomputed in the backward pass instead
(activation checkpointing of the head alone), and only the final hidden states are kept (appendix A1,
*Memory*).
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from rlcurate.policy.batching import TrainSample, plan_micro_batches
from rlcurate.models.prefill import plain_cache, prefill_prompts, shared_prefix_length

__all__ = ["forward_logprobs", "token_logprobs", "split_head", "sequence_logprobs", "sequence_logprobs_and_ranks",
           "grad_norms"]


def forward_logprobs(model, samples: Sequence[TrainSample], temperature: float, pad_id: int,
                     with_entropy: bool = False, share_prompts: bool = True):
    """Log-probabilities of each sample's completion tokens under ``model`` at ``temperature``.

    Sequences are left-padded so that every completion ends at the last position. The last token of
    every row is left out of the input: its logits would predict nothing and no later token attends
    to its key and value, so dropping it changes no number (up to float rounding between batch
    shapes) and saves 1 / (longest completion) of the completion positions. The output layer is
    applied only at completion positions, in checkpointed chunks (:func:`token_logprobs`), which
    matters for 150k-token vocabularies. Returns (logprobs [b, Lc], mask [b, Lc], entropy [b, Lc] or
    None), where row r's completion occupies the last len_r columns (zeros elsewhere).

    With ``share_prompts`` (the default), when several samples have the same prompt (the G completions
    of a GRPO group), each distinct prompt is encoded once and its key-value cache is shared by its
    samples, and the beginning that all the prompts share (a system turn, few-shot examples) is encoded
    once for the micro-batch (:func:`_forward_logprobs_shared`): the same numbers up to float rounding,
    the same gradients (they flow back through the shared cache), and G - 1 fewer copies of every
    prompt in the forward and backward pass.
    """
    if share_prompts and _can_share_prompts(model, samples):
        return _forward_logprobs_shared(model, samples, temperature, pad_id, with_entropy)
    device = next(model.parameters()).device
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    T = max(len(x) for x in seqs)
    Lc = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    comp_mask = torch.zeros((len(seqs), Lc), dtype=torch.bool)
    for r, (x, s) in enumerate(zip(seqs, samples)):
        ids[r, T - len(x):] = torch.tensor(x)
        attn[r, T - len(x):] = 1
        comp_mask[r, Lc - len(s.completion_ids):] = True
    ids, attn, comp_mask = ids.to(device), attn.to(device), comp_mask.to(device)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    decoder, head = split_head(model)
    # input position T - 1 - Lc + c predicts token T - Lc + c; every row's last token is no input
    out = decoder(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=position_ids[:, :-1],
                  use_cache=False)
    hidden = out.last_hidden_state[:, -Lc:]  # predicts the last Lc tokens
    return _scatter_logprobs(head, hidden, ids[:, T - Lc:], comp_mask, temperature, with_entropy)


def split_head(model):
    """``(decoder, head)`` of a causal language model: the module that returns the final hidden states
    and the output layer that maps them to logits. Raises ``ValueError`` for a model whose logits are
    more than ``head(hidden)`` (a soft cap or a scale on the logits), which :func:`token_logprobs`
    would get wrong."""
    cfg = getattr(model, "config", None)
    for field in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, field, None) not in (None, 1.0):
            raise ValueError(f"the model's config sets {field}: its logits are not its output layer's")
    decoder = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None:
        raise ValueError(f"{type(model).__name__} has no decoder and output layer to score with")
    return decoder, head


# fp32 bytes of log-softmax per chunk of positions: 256 MiB, ~440 positions of a 152k vocabulary
LOGIT_CHUNK_BYTES = 2**28


def token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool = False, chunk_bytes: int | None = None):
    """log pi(target_i) = z_i[target_i] - logsumexp(z_i), z_i = head(hidden_i) / temperature, for each
    row i of ``hidden`` [n, d] (and the entropy -sum_v pi_v log pi_v, without gradient), over chunks of
    at most ``chunk_bytes / (4 V)`` rows (default :data:`LOGIT_CHUNK_BYTES`). With gradients on, each
    chunk is checkpointed: its backward pass recomputes the chunk's logits from its hidden states, so
    no [n, V] tensor is kept. Returns
    (logprobs [n] float32, entropy [n] float32 or None)."""
    vocab = head.weight.shape[0]
    rows = max(1, int(chunk_bytes or LOGIT_CHUNK_BYTES) // (4 * vocab))

    def chunk(h, t):
        logp_all = F.log_softmax(head(h).float() / temperature, dim=-1)
        logp = logp_all.gather(-1, t[:, None]).squeeze(-1)
        if not with_entropy:
            return logp, None
        with torch.no_grad():
            return logp, -(logp_all.exp() * logp_all).sum(-1)

    checkpointed = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
    parts = []
    for i in range(0, hidden.shape[0], rows):
        h, t = hidden[i:i + rows], targets[i:i + rows]
        if checkpointed:
            parts.append(torch.utils.checkpoint.checkpoint(chunk, h, t, use_reentrant=False))
        else:
            parts.append(chunk(h, t))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    logp = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return logp, entropy


def _scatter_logprobs(head, hidden, targets, mask, temperature, with_entropy):
    """:func:`token_logprobs` of the positions where ``mask`` [b, Lc] is set, placed back on the
    [b, Lc] grid (zero elsewhere): ``hidden`` [b, Lc, d] predicts ``targets`` [b, Lc]."""
    sel_logp, sel_ent = token_logprobs(head, hidden[mask], targets[mask], temperature, with_entropy)
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(mask, sel_logp)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(mask, sel_ent)
    return logp, mask, entropy


def _can_share_prompts(model, samples: Sequence[TrainSample]) -> bool:
    """Whether sharing prompt caches pays and is exact: some prompt repeats or the prompts begin with a
    common prefix worth encoding once (:func:`~rlcurate.models.prefill.shared_prefix_length`), the model
    keeps a cache (no activation checkpointing in training), and every layer is full attention with a
    plain growing key-value cache (no sliding window, no recurrent or linear-attention state)."""
    keys = list({tuple(s.prompt_ids) for s in samples})
    if min(len(k) for k in keys) < 1:
        return False
    if len(keys) == len(samples) and shared_prefix_length(keys) == 0:
        return False
    if torch.is_grad_enabled() and getattr(model, "training", False) and getattr(model, "is_activation_checkpointing", False):
        return False  # checkpointed layers keep no cache in training: there is nothing to share
    cfg = getattr(model, "config", None)
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if set(layer_types) != {"full_attention"} or getattr(cfg, "is_encoder_decoder", False):
        return False
    sliding = getattr(cfg, "use_sliding_window", None)
    return not (sliding or (sliding is None and getattr(cfg, "sliding_window", None)))


def _forward_logprobs_shared(model, samples: Sequence[TrainSample], temperature: float, pad_id: int,
                             with_entropy: bool):
    """:func:`forward_logprobs` with each distinct prompt encoded once (chapter 5).

    1. The distinct prompts go through the model once (:func:`~rlcurate.models.prefill.prefill_prompts`:
       the C tokens they all share once, then each one's remainder, left-padded to S tokens; P = C + S).
       The hidden states at their last position predict each sample's first completion token; their
       key-value cache is indexed out to one row per sample (an indexing operation, so the gradients of
       every sample flow back into the shared prompt and prefix).
    2. The completions, left-padded to Lc, go through the model on top of that cache (left padding
       in the middle of a row is masked out; positions continue from each prompt's length), all but
       the last column, whose logits would predict nothing. The logits at block column c - 1 predict
       the token at column c, except at a row's first token, which takes the prompt's logits.
       Completions end at the last column, as in the unshared layout.
    """
    device = next(model.parameters()).device
    keys = [tuple(s.prompt_ids) for s in samples]
    uniq = list(dict.fromkeys(keys))
    slot = {k: u for u, k in enumerate(uniq)}
    lengths = torch.tensor([len(s.completion_ids) for s in samples], dtype=torch.long)
    Lc = int(lengths.max())
    ids = torch.full((len(samples), Lc), pad_id, dtype=torch.long)
    for r, s in enumerate(samples):
        ids[r, Lc - len(s.completion_ids):] = torch.tensor(s.completion_ids)
    cols = torch.arange(Lc)
    comp_mask = cols[None, :] >= (Lc - lengths)[:, None]
    first = cols[None, :] == (Lc - lengths)[:, None]  # each row's first completion token
    expand = torch.tensor([slot[k] for k in keys], dtype=torch.long)
    ids, comp_mask, first, expand = (t.to(device) for t in (ids, comp_mask, first, expand))

    decoder, head = split_head(model)
    every_token = torch.tensor(sorted({t for k in uniq for t in k} | {pad_id}), dtype=torch.long, device=device)
    with _one_embedding_lookup(decoder, torch.cat([every_token, ids.flatten()])):
        out, pre_attn, _ = prefill_prompts(decoder, uniq, pad_id, device)
        cache = out.past_key_values
        if not plain_cache(cache):
            # not a plain growing cache (a model with its own cache type, or gradient checkpointing, which
            # turns the cache off in training): use the unshared layout
            return forward_logprobs(model, samples, temperature, pad_id, with_entropy, share_prompts=False)
        P = pre_attn.shape[1]
        h_prompt = out.last_hidden_state[:, -1][expand]  # [b, d]: predicts each row's first token
        # the hidden state that predicts column c: the prompt's last one at a row's first token (column
        # Lc - len_r), block column c - 1 for every later token
        if Lc > 1:
            cache.batch_select_indices(expand)  # one row per sample; differentiable indexing
            attn = torch.cat([pre_attn[expand], comp_mask[:, :-1].long()], dim=1)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, P:]
            out = decoder(input_ids=ids[:, :-1], attention_mask=attn, position_ids=pos, past_key_values=cache,
                          use_cache=True)
            shifted = torch.cat([h_prompt[:, None], out.last_hidden_state], dim=1)  # [b, Lc, d]
        else:  # one-token completions: the prompt pass predicts them all, the block is empty
            shifted = h_prompt[:, None]
    hidden = torch.where(first[..., None], h_prompt[:, None], shifted)
    return _scatter_logprobs(head, hidden, ids, comp_mask, temperature, with_entropy)


@contextlib.contextmanager
def _one_embedding_lookup(decoder, token_ids: torch.Tensor):
    """Within the block, the decoder's input embedding returns rows of one lookup of the distinct ``token_ids``.
    The embeddings are the same, and so is the gradient up to the order of float sums, but the backward pass
    writes one dense gradient of the [V, d] embedding matrix instead of one per decoder call (three in the
    shared layout: the common prefix, the prompts' remainders, the completions), which for a 150k-token
    vocabulary is 0.5 GB zeroed and added per call. (A forward hook: each call's own lookup still runs, a
    gather of its ids' rows, but nothing flows back through it.) ``token_ids`` must hold every id the block's
    calls embed: an id outside it would get a neighbouring id's row. Only with gradients on; a no-op otherwise."""
    embed = decoder.get_input_embeddings() if hasattr(decoder, "get_input_embeddings") else None
    weight = getattr(embed, "weight", None)
    if embed is None or weight is None or not (torch.is_grad_enabled() and weight.requires_grad):
        yield
        return
    vocab = torch.unique(token_ids)  # sorted
    rows = embed(vocab)

    def from_rows(module, args, output):
        if not args or not isinstance(args[0], torch.Tensor):
            return None  # called some other way: keep the module's own lookup
        return rows[torch.searchsorted(vocab, args[0].contiguous())]

    handle = embed.register_forward_hook(from_rows)
    try:
        yield
    finally:
        handle.remove()


def sequence_logprobs(model, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                      pad_id: int, token_budget: int = 16384) -> list[np.ndarray]:
    """log pi(y_j | context, y_<j) for each (context, continuation) pair, at temperature 1, without
    gradients, batched under ``token_budget`` tokens (DRO's teacher-forced reference answer, chapter
    8). The model is scored in eval mode and left in the mode it was in. One float64 array per pair."""
    samples = [TrainSample(list(c), list(a), 0.0) for c, a in zip(contexts, continuations)]
    out: list[np.ndarray | None] = [None] * len(samples)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for mb in plan_micro_batches(samples, token_budget):
                batch = [samples[i] for i in mb]
                logp, mask, _ = forward_logprobs(model, batch, 1.0, pad_id)
                for r, i in enumerate(mb):
                    out[i] = logp[r, mask[r]].double().cpu().numpy()
    finally:
        model.train(was_training)
    return out  # type: ignore[return-value]


def sequence_logprobs_and_ranks(model, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                                pad_id: int, token_budget: int = 16384) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each (context, continuation) pair, log pi(y_j | context, y_<j) (float64) and the rank of
    y_j under pi(. | context, y_<j) (int64; 1 + the number of vocabulary tokens whose logit is
    strictly larger, so the most likely token has rank 1 and ties share the better rank), at
    temperature 1, without gradients, batched under ``token_budget`` tokens (DRO's "too hard" query
    filter, chapter 8). Left-padded, every continuation ending at the last position, as
    :func:`forward_logprobs` without prompt sharing; the model is scored in eval mode and left in the
    mode it was in. Every context must hold at least one token."""
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context must hold at least one token (the first continuation token needs one)")
    samples = [TrainSample(list(c), list(a), 0.0) for c, a in zip(contexts, continuations)]
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(samples)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for mb in plan_micro_batches(samples, token_budget):
                batch = [samples[i] for i in mb]
                seqs = [s.prompt_ids + s.completion_ids for s in batch]
                T = max(len(x) for x in seqs)
                Lc = max(len(s.completion_ids) for s in batch)
                if Lc == 0:
                    for i in mb:
                        out[i] = (np.zeros(0), np.zeros(0, dtype=np.int64))
                    continue
                ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
                attn = torch.zeros((len(seqs), T), dtype=torch.long)
                for r, x in enumerate(seqs):
                    ids[r, T - len(x):] = torch.tensor(x)
                    attn[r, T - len(x):] = 1
                ids, attn = ids.to(device), attn.to(device)
                position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
                logits = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=position_ids[:, :-1],
                               logits_to_keep=Lc, use_cache=False).logits.float()  # predicts the last Lc tokens
                targets = ids[:, T - Lc:]
                target_logit = logits.gather(-1, targets.unsqueeze(-1))
                logp = F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                rank = (logits > target_logit).sum(-1) + 1
                for r, (i, s) in enumerate(zip(mb, batch)):
                    n = len(s.completion_ids)
                    out[i] = (logp[r, Lc - n:].double().cpu().numpy(), rank[r, Lc - n:].cpu().numpy().astype(np.int64))
    finally:
        model.train(was_training)
    return out  # type: ignore[return-value]


def grad_norms(model, prompt_ids: Sequence[int], completions, temperature: float = 1.0,
               param_filter: str = "embed_tokens") -> np.ndarray:
    """GVM's G: for each completion y of the prompt x, the norm
    ||grad_theta_E (-sum_t log pi(y_t | x, y_<t))||_2 over the parameters whose name contains
    ``param_filter`` (GVM's ``act_params="embed_tokens"``): the sequence-summed log-probability, no
    length normalisation (chapter 3). With tied embeddings (the tiny model, small Qwen2.5 models) the
    embedding matrix is also the output layer, and its gradient holds both uses, as in GVM's code.

    ``completions`` are :class:`rlcurate.rollout.Completion` objects (their ``token_ids``) or lists of
    token ids; an empty completion has norm 0. The model's ``.grad`` fields are left untouched.
    """
    params = [p for name, p in model.named_parameters() if param_filter in name]
    if not params:
        raise ValueError(f"the model has no parameter whose name contains {param_filter!r}")
    device = params[0].device
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    out = np.zeros(len(completions))
    for k, comp in enumerate(completions):
        ids = [int(t) for t in (comp.token_ids if hasattr(comp, "token_ids") else comp)]
        if not ids:
            continue
        x = torch.tensor([prompt_ids + ids], dtype=torch.long, device=device)
        with torch.enable_grad():
            logits = model(input_ids=x, use_cache=False).logits[0, len(prompt_ids) - 1:-1].float()
            logp = torch.log_softmax(logits / temperature, dim=-1)
            nll = -logp.gather(1, x[0, len(prompt_ids):, None]).sum()
            grads = torch.autograd.grad(nll, params, allow_unused=True)
        out[k] = float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)))
    return out
