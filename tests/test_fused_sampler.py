"""The fused Triton sampler (:mod:`rlcurate.rollout.fused_sampler`, used by ``sample_next`` on a GPU for
temperature-only sampling) draws the tensor path's tokens and log-probabilities (issue #31). On a GPU it runs
compiled; on a CPU under Triton's interpreter, in a subprocess (the interpreter must be chosen before Triton
is first imported). Triton ships with torch's CUDA wheels, not its CPU ones (and is about 1 GB), so on the
CPU-only test machine these tests are skipped unless Triton is installed; bench/gpu_next.sh runs them first
on the GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

VOCABS = [7, 2048, 2049, 151_936]  # one block, exactly one, one and a bit, Qwen's


def check(vocab: int, device: str) -> None:
    from rlcurate.rollout import fused_sampler
    from rlcurate.rollout.sampling import sample_next_tensors

    gen = torch.Generator().manual_seed(vocab)
    rows = 64 if device == "cuda" else 6
    for scale, temperature in ((0.02, 1.0), (1.0, 1.0), (4.0, 0.7)):
        logits = (torch.randn(rows, vocab, generator=gen) * scale).to(device)
        u = torch.rand(rows, dtype=torch.float64, generator=gen).to(device)
        u[0] = 0.0  # the first token with mass
        want, want_lp = sample_next_tensors(logits, temperature, 0, 1.0, u)
        got, got_lp = fused_sampler.sample_rows(logits, temperature, u)
        assert torch.equal(got.cpu(), want.cpu()), (scale, temperature, got, want)
        assert torch.allclose(got_lp.cpu(), want_lp.cpu(), rtol=1e-5, atol=1e-5), (got_lp, want_lp)
        # a token of probability zero is never drawn, even at u just under 1
        logits[:, -1] = float("-inf")
        got, _ = fused_sampler.sample_rows(logits, temperature, torch.full_like(u, 1 - 2**-53))
        assert (got < vocab - 1).all(), got


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_fused_kernel_draws_the_tensor_paths_tokens(vocab):
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        check(vocab, "cuda")
        return
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__, str(vocab)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


if __name__ == "__main__":  # the interpreted check, in a process of its own
    check(int(sys.argv[1]), "cpu")
