"""One Triton kernel for :func:`rlcurate.rollout.sampling.sample_next` on a GPU, temperature-only sampling
(chapter 4; appendix A1, *Benchmarks*; issue #31).

``sample_next`` materialises the scaled logits, their fp32 log-softmax, an fp64 copy, its softmax and its
cumulative sum: five ``[rows, vocab]`` tensors, eight bytes an entry for three of them, 1.1 of a captured
step's 5.7 ms at 256 rows of a 151,936-token vocabulary on an H200 (``data/bench/decode_sampler_h200.json``).
This kernel reads each row of fp32 logits three times and writes nothing but the token and its
log-probability, one program per row:

1. the row's maximum ``m`` of ``z = logits / T``;
2. the total mass ``S = sum_v exp(z_v - m)``, each term and the sum in fp64;
3. the inverse CDF: the first token ``t`` whose running fp64 sum exceeds ``u * S`` (the running sum of
   the blocks before, plus the cumulative sum inside the block); a token of probability zero never.

``log p_t = (z_t - m) - log S``. The token is ``sample_next``'s up to the order of fp64 additions (the same
terms summed in another order, normalised after instead of before), so it can differ only where ``u * S``
falls within fp64 rounding (about 1e-16 relative) of a token boundary; the log-probability agrees to fp32
rounding. Top-k and top-p are not fused: with either, ``sample_next`` keeps the tensor path.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # triton comes with torch's CUDA wheels; without it the tensor path is used
    triton = None

BLOCK = 2048

if triton is not None:

    @triton.jit
    def _sample_rows(logits_ptr, u_ptr, temperature, tokens_ptr, logp_ptr, V, stride,
                     BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        # 1. the maximum of z = logits / T
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(base + offs, mask=offs < V, other=float("-inf")) / temperature
            m = tl.maximum(m, z)
        m_row = tl.max(m, axis=0)
        m64 = m_row.to(tl.float64)
        # 2. the total mass, fp64
        s = tl.zeros([BLOCK], tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(base + offs, mask=offs < V, other=float("-inf")) / temperature
            s += tl.where(offs < V, tl.exp(z.to(tl.float64) - m64), 0.0)
        total = tl.sum(s, axis=0)
        target = tl.load(u_ptr + row) * total
        # 3. the first token whose running sum exceeds the target (the last token with mass if rounding
        #    leaves none)
        running = tl.sum(tl.zeros([BLOCK], tl.float64), axis=0)
        token = V
        last = -1
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(base + offs, mask=offs < V, other=float("-inf")) / temperature
            e = tl.where(offs < V, tl.exp(z.to(tl.float64) - m64), 0.0)
            c = running + tl.cumsum(e, axis=0)
            token = tl.minimum(token, tl.min(tl.where((c > target) & (e > 0), offs, V), axis=0))
            last = tl.maximum(last, tl.max(tl.where(e > 0, offs, -1), axis=0))
            running += tl.sum(e, axis=0)
        token = tl.where(token == V, last, token)
        z_t = tl.load(base + token) / temperature
        logp = (z_t - m_row).to(tl.float64) - tl.log(total)
        tl.store(tokens_ptr + row, token.to(tl.int64))
        tl.store(logp_ptr + row, logp.to(tl.float32))


def sample_rows(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [B] int64, logprobs [B] fp32)`` of :func:`sample_next` with ``top_k = 0, top_p = 1`` and
    ``temperature > 0``, in one kernel (the module docstring gives the equations)."""
    B, V = logits.shape
    logits = logits.float().contiguous()
    u = u.to(device=logits.device, dtype=torch.float64).reshape(B).contiguous()
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    logp = torch.empty(B, dtype=torch.float32, device=logits.device)
    _sample_rows[(B,)](logits, u, float(temperature), tokens, logp, V, logits.stride(0), BLOCK=BLOCK)
    return tokens, logp
