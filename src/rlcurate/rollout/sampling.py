"""Token sampling for the local engine (chapter 4, *The variance audit*).

Two pieces, both pure functions so they can be tested on their own:

* :func:`uniforms` gives the random number that picks token ``t`` of sample ``j`` of prompt ``i``
  as a hash of ``(seed, i, j, t)``. Every completion therefore has its own random stream, and its
  tokens do not depend on which other rows share its batch, on the token budget or on batch order.
* :func:`sample_next` turns next-token logits into a token and its log-probability: temperature,
  then top-k, then top-p (each on the distribution left by the previous step), then inverse-CDF
  sampling with the given uniforms, by :func:`sample_next_tensors`. With ``RLCURATE_FUSED_SAMPLER=1``,
  temperature-only sampling on a GPU runs one Triton kernel instead (:mod:`rlcurate.rollout.fused_sampler`,
  no vocabulary-wide tensor); it is off by default until it has been compiled, checked and timed on a GPU
  (``bench/gpu_next.sh``).
"""

from __future__ import annotations

import os

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    # SplitMix64 finaliser (Steele, Lea and Flood 2014): a bijective mixer of 64-bit words whose
    # outputs pass BigCrush; uint64 arithmetic wraps modulo 2**64 as required.
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, prompt_index, sample_index, step: int) -> np.ndarray:
    """Uniform numbers in [0, 1), one per row, as a hash of ``(seed, prompt, sample, step)``.

    ``u = H(H(H(H(seed) xor i) xor j) xor t) / 2**64`` with ``H`` the SplitMix64 mixer, keeping the
    top 53 bits so that ``u`` is an exact float64. Used by :class:`TransformersEngine` (chapter 4),
    which computes the per-row part ``H(H(H(seed) xor i) xor j)`` once (:func:`row_keys`) and mixes
    in only the step at each token (:func:`step_uniforms`).
    """
    return step_uniforms(row_keys(seed, prompt_index, sample_index), step)


def row_keys(seed: int, prompt_index, sample_index) -> np.ndarray:
    """The per-row part of :func:`uniforms`, ``H(H(H(seed) xor i) xor j)`` as uint64."""
    i = np.asarray(prompt_index, dtype=np.uint64)
    j = np.asarray(sample_index, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.full(i.shape, seed & _MASK64, dtype=np.uint64))
        h = _splitmix64(h ^ i)
        return _splitmix64(h ^ j)


def step_uniforms(keys: np.ndarray, step) -> np.ndarray:
    """:func:`uniforms` of the rows whose :func:`row_keys` are ``keys``, at token ``step`` (an int, or an array of
    steps that broadcasts against ``keys``: one row's whole stream is ``step_uniforms(key, np.arange(T))``)."""
    with np.errstate(over="ignore"):
        h = _splitmix64(keys ^ np.asarray(step, dtype=np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) * (2.0**-53)


def truncate_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to ``-inf`` the logits that top-k and then top-p remove (chapter 4).

    Top-k keeps every token whose logit is at least the k-th largest (ties are kept). Top-p then keeps,
    in order of decreasing probability under the top-k distribution, the shortest prefix whose mass
    reaches ``top_p``; the most likely token is always kept.
    """
    out = scaled
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits.double(), dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                u) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` [B, V]; return ``(tokens [B], logprobs [B])`` (chapter 4).

    ``logprobs`` is ``log softmax(logits / T)`` at the drawn token, before truncation (for ``T = 0``,
    greedy, ``log softmax(logits)`` at the argmax). The token is the inverse CDF of the truncated,
    renormalised distribution at ``u`` [B]: the first token whose cumulative probability exceeds ``u``.
    """
    if temperature > 0 and not 0 < top_k < logits.shape[-1] and top_p >= 1.0 and logits.is_cuda \
            and os.environ.get("RLCURATE_FUSED_SAMPLER") == "1" and _fused_ok(logits.device):
        from . import fused_sampler

        return fused_sampler.sample_rows(logits, temperature, torch.as_tensor(u, dtype=torch.float64))
    return sample_next_tensors(logits, temperature, top_k, top_p, u)


def sample_next_tensors(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                        u) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next` with torch tensor operations only: what it runs unless the fused GPU kernel is
    switched on (module docstring; :mod:`rlcurate.rollout.fused_sampler` draws the same tokens up to fp64
    rounding)."""
    logits = logits.float()
    if temperature == 0:
        tokens = torch.argmax(logits, dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / temperature
        logp = torch.log_softmax(scaled, dim=-1)
        probs = torch.softmax(truncate_logits(scaled, top_k, top_p).double(), dim=-1)
        cdf = torch.cumsum(probs, dim=-1)
        target = torch.as_tensor(u, dtype=torch.float64, device=logits.device).reshape(-1, 1) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


_FUSED: list[bool] = []


def _fused_ok(device) -> bool:
    """Whether the fused kernel is used on a GPU: Triton is importable and the kernel compiled at its first
    use (if it fails to compile, a warning says so once and the tensor path is used from then on)."""
    if not _FUSED:
        from . import fused_sampler

        ok = fused_sampler.triton is not None
        if ok:
            try:
                fused_sampler.sample_rows(torch.zeros(1, 8, device=device), 1.0, torch.zeros(1, dtype=torch.float64))
            except Exception as exc:  # a Triton that cannot build it here: keep the tensor path
                import warnings

                warnings.warn(f"the fused sampler did not compile ({type(exc).__name__}: {exc}); "
                              "sampling with torch tensor operations", RuntimeWarning, stacklevel=3)
                ok = False
        _FUSED.append(ok)
    return _FUSED[0]
