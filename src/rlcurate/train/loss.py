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

from typing import Sequence

import numpy as np
import torch

from rlcurate.policy.batching import TrainSample, plan_micro_batches
from rlcurate.policy.scoring import forward_logprobs

__all__ = ["TrainSample", "aggregation_coefficients", "forward_logprobs", "policy_loss",
           "plan_micro_batches"]  # the first, third and last live in rlcurate.policy


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
