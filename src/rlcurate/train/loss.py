"""The GRPO loss on token sequences (chapter 5, *The GRPO loop*).

For completion tokens a_t with advantage A (one per completion, times the group weight), ratio
rho_t = pi_theta(a_t | ...) / pi_old(a_t | ...), and a per-token weight c_t,

    l_t = c_t * pg_t  +  beta * min(k3_t, K),
    pg_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high)),  and for A < 0: min(pg_t, -A c),
    k3_t = exp(q_t) - q_t - 1,   q_t = log pi_ref(a_t) - log pi_theta(a_t)      (Schulman's k3),

with rho_t = exp(clamp(log pi_theta - log pi_old, -L, L)) and q_t clamped to [-L, L] likewise. The
three safety clamps are verl's (``compute_policy_loss_vanilla`` and ``kl_penalty(..., "low_var_kl")``
in ``verl.trainer.ppo.core_algos``), with its defaults: the dual clip c = ``clip_ratio_c`` = 3 (Ye et
al. 2020; a negative-advantage token's loss stops growing with its ratio; Reinforce-Ada's script sets
10), L = ``log_ratio_clamp`` = 20 and K = ``kl_clamp`` = 10 (verl clamps k3 to [-10, 10]); 0 turns
each off. TRL's GRPO loss clamps neither the log-ratio nor k3; its ``delta`` (two-sided clipping,
default off) caps the ratio of every token at delta, which for A < 0 is this dual clip with
c = delta. On-policy (one pass, one minibatch) rho = 1 and the first two never act; the k3 clamp acts
only far from the reference.

The loss is sum_t kappa_t l_t, where kappa_t sets the aggregation:

- ``token-mean`` (DAPO): kappa = 1 / (tokens in the batch). TRL's ``dapo`` loss is the same; TRL's
  ``bnpo`` divides by the tokens of each *micro-batch* and then by the accumulation steps, so it
  differs from this whenever micro-batches hold different numbers of tokens;
- ``seq-mean-token-mean`` (GRPO): kappa = 1 / (len(seq) * sequences);
- ``seq-mean-token-sum-norm`` (Dr. GRPO): kappa = 1 / (max_new_tokens * sequences), TRL's ``dr_grpo``
  (which divides by micro-batch sequences times ``max_completion_length``). verl's ``agg_loss`` in
  the mode of the same name divides the token sums by ``loss_scale_factor`` (default: the padded
  response length of what it is given) and by the global batch size: on one batch padded to
  ``max_new_tokens`` it equals this mode (tests/test_fidelity.py), while inside verl's trainer the
  normaliser follows its ``global_batch_info`` (issue #13 measured N times TRL's ``dr_grpo`` there).

Writing the aggregation as a per-token coefficient makes gradient accumulation over micro-batches
exact: each micro-batch adds its share of one global sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["TrainSample", "aggregation_coefficients", "forward_logprobs", "policy_loss",
           "plan_micro_batches"]


@dataclass
class TrainSample:
    """One completion to train on."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    token_weights: np.ndarray | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    coef: torch.Tensor | None = None  # kappa_t per token, set by aggregation_coefficients

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def aggregation_coefficients(samples: Sequence[TrainSample], mode: str, max_new_tokens: int,
                             n_total_tokens: int | None = None, n_total_seqs: int | None = None) -> None:
    """Set ``sample.coef`` (kappa_t for each completion token) for the aggregation ``mode``.

    ``n_total_tokens``/``n_total_seqs`` are the batch totals, which may include samples that are not
    in ``samples`` (zero-advantage samples the trainer skips still count in the mean).
    """
    tokens = n_total_tokens if n_total_tokens is not None else sum(len(s.completion_ids) for s in samples)
    seqs = n_total_seqs if n_total_seqs is not None else len(samples)
    for s in samples:
        L = len(s.completion_ids)
        if mode == "token-mean":
            c = 1.0 / max(tokens, 1)
        elif mode == "seq-mean-token-mean":
            c = 1.0 / (max(L, 1) * max(seqs, 1))
        elif mode == "seq-mean-token-sum-norm":
            c = 1.0 / (max_new_tokens * max(seqs, 1))
        else:
            raise ValueError(f"loss_agg must be token-mean, seq-mean-token-mean or seq-mean-token-sum-norm, got {mode!r}")
        s.coef = torch.full((L,), c, dtype=torch.float32)


def plan_micro_batches(samples: Sequence[TrainSample], token_budget: int) -> list[list[int]]:
    """Group sample indices so that (rows x longest row) <= ``token_budget`` per micro-batch; samples
    are taken longest first so that padding stays small, and the samples of one prompt (a GRPO group)
    stay next to each other so that :func:`forward_logprobs` can encode their prompt once. A sample
    longer than the budget gets its own micro-batch. With distinct prompts the order is simply longest
    first, ties by index."""
    group_len: dict[tuple, int] = {}
    group_first: dict[tuple, int] = {}
    for i, s in enumerate(samples):
        key = tuple(s.prompt_ids)
        group_len[key] = max(group_len.get(key, 0), s.length)
        group_first.setdefault(key, i)

    def order_key(i):
        key = tuple(samples[i].prompt_ids)
        return (-group_len[key], group_first[key], -samples[i].length, i)

    order = sorted(range(len(samples)), key=order_key)
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        L = samples[i].length
        if current and max(longest, L) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, L)
    if current:
        batches.append(current)
    return batches


def forward_logprobs(model, samples: Sequence[TrainSample], temperature: float, pad_id: int,
                     with_entropy: bool = False, share_prompts: bool = True):
    """Log-probabilities of each sample's completion tokens under ``model`` at ``temperature``.

    Sequences are left-padded so that every completion ends at the last position. The last token of
    every row is left out of the input: its logits would predict nothing and no later token attends
    to its key and value, so dropping it changes no number (up to float rounding between batch
    shapes) and saves 1 / (longest completion) of the completion positions. Only the logits of the
    last Lc input positions are computed (``logits_to_keep``), which matters for 150k-token
    vocabularies. Returns (logprobs [b, Lc], mask [b, Lc], entropy [b, Lc] or None), where row r's
    completion occupies the last len_r columns.

    With ``share_prompts`` (the default), when several samples have the same prompt (the G completions
    of a GRPO group), each distinct prompt is encoded once and its key-value cache is shared by its
    samples (:func:`_forward_logprobs_shared`): the same numbers up to float rounding, the same
    gradients (they flow back through the shared cache), and G - 1 fewer copies of every prompt in the
    forward and backward pass.
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
    # input position T - 1 - Lc + c predicts token T - Lc + c; every row's last token is no input
    out = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=position_ids[:, :-1],
                logits_to_keep=Lc, use_cache=False)
    logits = out.logits.float() / temperature  # predicts the last Lc tokens
    targets = ids[:, T - Lc:]
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, comp_mask, entropy


def _can_share_prompts(model, samples: Sequence[TrainSample]) -> bool:
    """Whether sharing prompt caches pays and is exact: some prompt repeats, and every layer is full
    attention with a plain growing key-value cache (no sliding window, no recurrent or
    linear-attention state)."""
    keys = {tuple(s.prompt_ids) for s in samples}
    if len(keys) == len(samples) or min(len(k) for k in keys) < 1:
        return False
    cfg = getattr(model, "config", None)
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if set(layer_types) != {"full_attention"} or getattr(cfg, "is_encoder_decoder", False):
        return False
    sliding = getattr(cfg, "use_sliding_window", None)
    return not (sliding or (sliding is None and getattr(cfg, "sliding_window", None)))


def _forward_logprobs_shared(model, samples: Sequence[TrainSample], temperature: float, pad_id: int,
                             with_entropy: bool):
    """:func:`forward_logprobs` with each distinct prompt encoded once (chapter 5).

    1. The distinct prompts, left-padded to a common length P, go through the model once. The logits
       at their last position predict each sample's first completion token; their key-value cache is
       indexed out to one row per sample (an indexing operation, so the gradients of every sample flow
       back into the shared prompt).
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
    P = max(len(k) for k in uniq)
    pre_ids = torch.full((len(uniq), P), pad_id, dtype=torch.long)
    pre_attn = torch.zeros((len(uniq), P), dtype=torch.long)
    for u, k in enumerate(uniq):
        pre_ids[u, P - len(k):] = torch.tensor(k)
        pre_attn[u, P - len(k):] = 1
    lengths = torch.tensor([len(s.completion_ids) for s in samples], dtype=torch.long)
    Lc = int(lengths.max())
    ids = torch.full((len(samples), Lc), pad_id, dtype=torch.long)
    for r, s in enumerate(samples):
        ids[r, Lc - len(s.completion_ids):] = torch.tensor(s.completion_ids)
    cols = torch.arange(Lc)
    comp_mask = cols[None, :] >= (Lc - lengths)[:, None]
    first = cols[None, :] == (Lc - lengths)[:, None]  # each row's first completion token
    expand = torch.tensor([slot[k] for k in keys], dtype=torch.long)
    pre_ids, pre_attn, ids, comp_mask, first, expand = (
        t.to(device) for t in (pre_ids, pre_attn, ids, comp_mask, first, expand))

    pre_pos = (pre_attn.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=pre_ids, attention_mask=pre_attn, position_ids=pre_pos, use_cache=True,
                logits_to_keep=1)
    cache = out.past_key_values
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        # not a plain growing cache (a model with its own cache type): use the unshared layout
        return forward_logprobs(model, samples, temperature, pad_id, with_entropy, share_prompts=False)
    prompt_logits = out.logits[:, -1, :][expand]  # [b, V]: predicts each row's first token
    # log-probabilities at [b, Lc] from two sources, never concatenating the [b, Lc, V] logits:
    # the prompt's last position predicts column Lc - len_r (the row's first token), block column c - 1
    # predicts column c for every later token
    lp_first_all = F.log_softmax(prompt_logits.float() / temperature, dim=-1)  # [b, V]
    first_tok = (ids * first).sum(-1)  # [b]
    lp_first = lp_first_all.gather(-1, first_tok[:, None]).squeeze(-1)  # [b]
    if Lc > 1:
        cache.batch_select_indices(expand)  # one row per sample; differentiable indexing
        attn = torch.cat([pre_attn[expand], comp_mask[:, :-1].long()], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, P:]
        out = model(input_ids=ids[:, :-1], attention_mask=attn, position_ids=pos, past_key_values=cache,
                    use_cache=True)
        lp_block_all = F.log_softmax(out.logits.float() / temperature, dim=-1)  # [b, Lc - 1, V]
    else:  # one-token completions: the prompt pass predicts them all, the block is empty
        lp_block_all = lp_first_all.new_empty((len(samples), 0, lp_first_all.shape[-1]))
    lp_block = lp_block_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [b, Lc - 1]
    logp = torch.where(first, lp_first[:, None], torch.cat([lp_first[:, None], lp_block], dim=1))
    entropy = None
    if with_entropy:
        with torch.no_grad():
            ent_first = -(lp_first_all.exp() * lp_first_all).sum(-1)
            ent_block = -(lp_block_all.exp() * lp_block_all).sum(-1)
            entropy = torch.where(first, ent_first[:, None], torch.cat([ent_first[:, None], ent_block], dim=1))
    return logp, comp_mask, entropy


def _pad_right_aligned(values: Sequence[torch.Tensor], Lc: int, device) -> torch.Tensor:
    out = torch.zeros((len(values), Lc), dtype=torch.float32, device=device)
    for r, v in enumerate(values):
        if v is not None and len(v):
            out[r, Lc - len(v):] = torch.as_tensor(v, dtype=torch.float32, device=device)
    return out


def policy_loss(logp: torch.Tensor, mask: torch.Tensor, samples: Sequence[TrainSample], clip_low: float,
                clip_high: float, kl_coef: float, clip_ratio_c: float = 3.0, log_ratio_clamp: float = 20.0,
                kl_clamp: float = 10.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped-surrogate loss of one micro-batch (its share of the global sum) and statistics.
    ``clip_ratio_c``, ``log_ratio_clamp`` and ``kl_clamp`` are verl's safety clamps (module docstring;
    0 turns one off)."""
    device = logp.device
    Lc = logp.shape[1]
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device)[:, None]
    coef = _pad_right_aligned([s.coef for s in samples], Lc, device)
    tw = _pad_right_aligned([np.ones(len(s.completion_ids)) if s.token_weights is None else s.token_weights
                             for s in samples], Lc, device)
    if all(s.old_logprobs is not None for s in samples):
        old = _pad_right_aligned([s.old_logprobs for s in samples], Lc, device)
    else:
        old = logp.detach()
    maskf = mask.float()
    log_ratio = (logp - old) * maskf
    clamped = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp) if log_ratio_clamp > 0 else log_ratio
    ratio = torch.exp(clamped)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    if clip_ratio_c > 0:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * clip_ratio_c), pg)
    per_token = pg * tw
    stats: dict[str, float] = {}
    if kl_coef > 0:
        ref = _pad_right_aligned([s.ref_logprobs for s in samples], Lc, device)
        q = (ref - logp) * maskf
        if log_ratio_clamp > 0:
            q = torch.clamp(q, -log_ratio_clamp, log_ratio_clamp)
        k3 = torch.exp(q) - q - 1.0
        if kl_clamp > 0:
            k3 = torch.clamp(k3, -kl_clamp, kl_clamp)
        per_token = per_token + kl_coef * k3
        stats["kl_ref_sum"] = float((k3.detach() * maskf).sum())
    loss = (per_token * coef * maskf).sum()
    n_tok = float(maskf.sum())
    with torch.no_grad():
        stats["clipped_sum"] = float((((pg2 > pg1) & mask)).float().sum())
        stats["approx_kl_sum"] = float((0.5 * log_ratio**2 * maskf).sum())
        stats["tokens"] = n_tok
    return loss, stats
