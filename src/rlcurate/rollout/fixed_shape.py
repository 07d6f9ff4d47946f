"""Fixed-shape decoding: one persistent KV cache per engine, and a decode step whose shapes never change,
replayed as a CUDA graph on a GPU (appendix A1, *Benchmarks*; issue #31).

On a GPU the eager decode loop is bound by per-step overhead, not by memory bandwidth: a 24-layer model
launches several hundred small kernels a token, and the loop adds host syncs and Python work per row.
gpt-fast's recipe removes both: keep every tensor of the decode at a fixed address and shape, and record
the whole step (forward, sampling, end-of-sequence bookkeeping, the token and log-probability writes)
once as a CUDA graph, then replay it. This module does that with torch and transformers alone:

* :class:`KVBuffers` is the key-value cache: per layer one tensor ``[rows, kv_heads, max_len, head_dim]``
  in :func:`kv_cache_dtype`, written in place at the position ``write_at`` (a device tensor). A batch of
  ``B`` rows uses the first ``bucket_rows(B)`` rows of it (a view), so a graph is recorded once per
  bucket and engine, not once per batch; the storage grows (and the graphs are dropped) only when a
  batch needs more rows or columns than any before it.
* :class:`DecodeStep` holds one bucket's state (logits, per-row random keys, the output tokens and
  log-probabilities, finished flags, lengths, the attention mask, positions, the step counter) and the
  step that advances it by one token. Nothing in the step reads a value back to the host: the host looks
  at the finished flags only every ``sync_every`` steps.
* Token ``t`` of row ``(i, j)`` is drawn with the same uniform number as on the eager path,
  ``uniforms(seed, i, j, t)`` (:mod:`rlcurate.rollout.sampling`), computed on the device by
  :func:`step_uniforms_device` (SplitMix64 in int64 arithmetic, bit for bit the host's uint64 one), so
  the completions are the same whatever the path and the batching.

Attention over the fixed-shape cache is :func:`decode_attention`, registered with ``transformers`` as
``rlcurate_decode`` and used for the decode step only: scaled-dot-product attention with a mask (the
cache's unwritten columns) cannot take grouped-query heads as they are, so ``transformers`` expands the
keys and values of every layer to all query heads first, which on a GPU cost more than the rest of the
step (measured on an H200 at 1,024 rows: 18.6 of 29 ms; ``data/bench/decode_parts_h200.json``).

The KV cache dtype is one decision (:func:`kv_cache_dtype`): the dtype attention computes in, that is
autocast's when autocast is on (the trainer: fp32 weights under bf16 autocast on a GPU) and the weights'
otherwise. Under autocast, scaled-dot-product attention casts its inputs to that dtype anyway, so storing
keys and values in it changes no number; the planner (:mod:`rlcurate.plan`) charges the same bytes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from .sampling import sample_next

__all__ = ["kv_cache_dtype", "bucket_rows", "step_uniforms_device", "KVBuffers", "DecodeStep", "FixedShapeDecoder"]

MIN_BUCKET = 8
COLUMN_QUANTUM = 64


def kv_cache_dtype(model, device_type: str) -> torch.dtype:
    """The dtype the KV cache holds (one decision for every decode path and the planner): autocast's
    dtype when autocast is enabled on ``device_type``, else the dtype of ``model``'s weights."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return next(model.parameters()).dtype


def bucket_rows(n: int) -> int:
    """The rows of the graph that decodes a batch of ``n`` rows: the next power of two, at least 8."""
    return max(MIN_BUCKET, 1 << (max(n, 1) - 1).bit_length())


def _as_int64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_SM_ADD = _as_int64(0x9E3779B97F4A7C15)
_SM_MUL1 = _as_int64(0xBF58476D1CE4E5B9)
_SM_MUL2 = _as_int64(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 words holding uint64 bits (``>>`` on int64 is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _splitmix64_device(x: torch.Tensor) -> torch.Tensor:
    # int64 addition and multiplication wrap modulo 2**64 exactly as uint64 does, so these are the bits
    # of sampling._splitmix64
    x = x + _SM_ADD
    x = (x ^ _shift_right(x, 30)) * _SM_MUL1
    x = (x ^ _shift_right(x, 27)) * _SM_MUL2
    return x ^ _shift_right(x, 31)


def step_uniforms_device(keys: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """:func:`rlcurate.rollout.sampling.step_uniforms` on the device: ``keys`` are the rows'
    :func:`~rlcurate.rollout.sampling.row_keys` as int64 (same bits), ``step`` an int64 tensor."""
    h = _splitmix64_device(keys ^ step)
    return _shift_right(h, 11).to(torch.float64) * (2.0**-53)


def keys_as_int64(keys: np.ndarray) -> torch.Tensor:
    """Host uint64 row keys as an int64 tensor with the same bits."""
    return torch.from_numpy(np.ascontiguousarray(keys, dtype=np.uint64).view(np.int64))


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of one new token per row over the whole fixed-shape cache, grouped-query heads kept
    grouped: with ``g = heads / kv_heads`` query heads per key-value head (head ``h`` reads key-value
    head ``h // g``, as ``transformers``' ``repeat_kv``),

        out[b, h] = softmax(scaling * q[b, h] . K[b, h // g]^T  masked to the attended columns) V[b, h // g],

    the scores computed in the inputs' dtype (bf16 under the trainer's autocast: rounded to bf16, as
    ``transformers``' eager attention does, where SDPA's fused kernels keep them in fp32), then cast to fp32
    for the mask and softmax. ``query`` [B, H, 1, D], ``key``/``value`` [B, Hkv, L, D],
    ``attention_mask`` [B, 1, 1, L], boolean (True: attend) or additive. Returns ``(out [B, 1, H, D], None)``
    like ``transformers``' attention functions."""
    B, H, q_len, D = query.shape
    if q_len != 1:
        raise ValueError("decode_attention attends from one new token per row")
    kv_heads = key.shape[1]
    scaling = D ** -0.5 if scaling is None else scaling
    grouped = query.reshape(B, kv_heads, H // kv_heads, D)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scaling  # [B, Hkv, g, L]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, Hkv, g, D]
    return out.reshape(B, 1, H, D), None


DECODE_ATTENTION = "rlcurate_decode"


def _register_decode_attention():
    from transformers import AttentionInterface

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)


_register_decode_attention()


@contextlib.contextmanager
def _attention(config, name: str):
    """``config``'s attention implementation set to ``name`` for the block (the decode step)."""
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


class KVBuffers:
    """A key-value cache of fixed shape that a ``transformers`` model writes through ``update``: per
    layer ``keys[l]`` and ``values[l]`` of ``[rows, kv_heads, max_len, head_dim]``; each call writes the
    new column(s) at ``write_at`` (an int64 device tensor of one element), cast to the cache's dtype."""

    is_compileable = True

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], write_at: torch.Tensor):
        self.keys, self.values, self.write_at = keys, values, write_at

    @classmethod
    def allocate(cls, layers: int, rows: int, kv_heads: int, max_len: int, k_dim: int, v_dim: int, dtype, device):
        keys = [torch.zeros(rows, kv_heads, max_len, k_dim, dtype=dtype, device=device) for _ in range(layers)]
        values = [torch.zeros(rows, kv_heads, max_len, v_dim, dtype=dtype, device=device) for _ in range(layers)]
        return cls(keys, values, torch.zeros(1, dtype=torch.long, device=device))

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def first_rows(self, n: int) -> "KVBuffers":
        """A view of the first ``n`` rows (same storage, same ``write_at``)."""
        return KVBuffers([k[:n] for k in self.keys], [v[:n] for v in self.values], self.write_at)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.write_at, key_states.to(keys.dtype))
        values.index_copy_(2, self.write_at, value_states.to(values.dtype))
        return keys, values

    # what a transformers model may ask of its cache while decoding one token with an explicit 4-D mask
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.write_at)

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class StepKey:
    rows: int
    temperature: float
    top_k: int
    top_p: float
    eos: tuple[int, ...]
    autocast: tuple


class DecodeStep:
    """One bucket's decode state and the step that advances it by one token (see the module docstring).

    State (all on the device, fixed addresses): ``logits`` [R, V] fp32, ``keys`` [R] int64 (row keys),
    ``tokens`` [R, T] and ``logprobs`` [R, T], ``finished`` [R] bool, ``length`` [R] (tokens kept: those up
    to and including the end-of-sequence token), ``mask`` [R, max_len] bool (columns attended to),
    ``position`` [R] (the next token's position id), ``t`` [1] (the step). One step: draw token t with
    ``uniforms(seed, i, j, t)``, write it and its log-probability, count it for the rows not finished
    before it, mark the rows whose token ends the sequence, open column ``write_at`` of the mask and run
    the one-token forward that writes it, keep its logits; advance ``t``, ``write_at`` and the positions.
    """

    def __init__(self, model, cache: KVBuffers, key: StepKey, max_new_tokens: int, vocab: int):
        dev = cache.keys[0].device
        R = key.rows
        self.model, self.cache, self.key = model, cache, key
        self.logits = torch.zeros(R, vocab, dtype=torch.float32, device=dev)
        self.keys = torch.zeros(R, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(R, max_new_tokens, dtype=torch.long, device=dev)
        self.logprobs = torch.zeros(R, max_new_tokens, dtype=torch.float32, device=dev)
        self.finished = torch.zeros(R, dtype=torch.bool, device=dev)
        self.length = torch.zeros(R, dtype=torch.long, device=dev)
        self.mask = torch.zeros(R, cache.max_len, dtype=torch.bool, device=dev)
        self.position = torch.zeros(R, dtype=torch.long, device=dev)
        self.t = torch.zeros(1, dtype=torch.long, device=dev)
        self.eos = torch.tensor(key.eos or (-1,), dtype=torch.long, device=dev)
        self.graph = None
        self.run = self.step

    @property
    def max_new_tokens(self) -> int:
        return self.tokens.shape[1]

    def step(self):
        k = self.key
        u = step_uniforms_device(self.keys, self.t)
        tok, lp = sample_next(self.logits, k.temperature, k.top_k, k.top_p, u)
        self.tokens.index_copy_(1, self.t, tok[:, None])
        self.logprobs.index_copy_(1, self.t, lp[:, None].float())
        self.length.add_((~self.finished).long())
        self.finished.logical_or_(torch.isin(tok, self.eos))
        self.mask.index_fill_(1, self.cache.write_at, True)
        self.forward(tok)
        self.t.add_(1)
        self.cache.write_at.add_(1)
        self.position.add_(1)

    def forward(self, tok: torch.Tensor):
        """The one-token forward of :meth:`step`: writes column ``write_at`` of the cache and the logits.
        (What ``decode="compiled"`` compiles; the sampler stays eager, see :class:`FixedShapeDecoder`.)"""
        with _attention(self.model.config, DECODE_ATTENTION):
            out = self.model(input_ids=tok[:, None], attention_mask=self.mask[:, None, None, :],
                             position_ids=self.position[:, None], past_key_values=self.cache, use_cache=True,
                             cache_position=self.cache.write_at, logits_to_keep=1)
        self.logits.copy_(out.logits[:, -1, :])

    def capture(self, warmup: int = 2):
        """Record :meth:`step` as a CUDA graph (after ``warmup`` eager steps on a side stream, as CUDA
        graphs require); the state it leaves is reset by the caller before every batch. Autocast's
        weight-cast cache is off inside the graph (a graph must not depend on tensors created outside it)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), _autocast_without_cache(self.key.autocast):
            for _ in range(warmup):
                self.step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), _autocast_without_cache(self.key.autocast):
            self.step()
        self.run = self.graph.replay


def _autocast_state(device_type: str) -> tuple:
    if torch.is_autocast_enabled(device_type):
        return (device_type, torch.get_autocast_dtype(device_type))
    return ()


def _autocast_without_cache(state: tuple):
    if not state:
        return contextlib.nullcontext()
    return torch.autocast(state[0], dtype=state[1], cache_enabled=False)


class FixedShapeDecoder:
    """The persistent cache and the per-bucket steps of one engine (see the module docstring).

    ``mode``: ``"static"`` runs the step eagerly; ``"captured"`` replays it as a CUDA graph on a GPU
    (eagerly elsewhere); ``"compiled"`` compiles the step's one-token forward with ``torch.compile``
    (inductor, fusing the norms, rotary embeddings, activations and residual adds) and, on a GPU, replays
    the whole step as a CUDA graph. The sampler stays eager: compiling it too failed in inductor 2.11's
    CUDA code generation (``data/bench/decode_compiled_h200.json``; the fp64 cumulative sum over the
    vocabulary is the suspect, not isolated), and left eager it is the same code on every path.
    ``compile_backend`` is for tests (a counting backend counts recompiles without generating code).
    """

    def __init__(self, model, mode: str, sync_every: int = 8, compile_backend: str = "inductor"):
        self.model, self.mode, self.sync_every = model, mode, int(sync_every)
        self.compile_backend = compile_backend
        self.cache: KVBuffers | None = None
        self.steps: dict[StepKey, DecodeStep] = {}
        if any(t != "full_attention" for t in (getattr(model.config, "layer_types", None) or [])):
            raise ValueError("fixed-shape decoding does not support sliding-window layers; use decode='dynamic'")
        self.graphs_recorded = 0

    def _storage(self, prefill_cache, rows: int, max_len: int, dtype) -> KVBuffers:
        """The persistent cache, grown (to the next bucket of rows and the next multiple of 64 columns)
        when this batch needs more than it holds; growing drops the recorded steps."""
        c = self.cache
        if c is not None and c.rows >= rows and c.max_len >= max_len and c.keys[0].dtype == dtype:
            return c
        k0, v0 = prefill_cache.layers[0].keys, prefill_cache.layers[0].values
        rows = max(rows, c.rows if c is not None else 0)
        cols = -(-max(max_len, c.max_len if c is not None else 0) // COLUMN_QUANTUM) * COLUMN_QUANTUM
        self.cache = self.steps = None  # free the old storage before allocating the new
        self.cache = KVBuffers.allocate(len(prefill_cache.layers), rows, k0.shape[1], cols, k0.shape[-1],
                                        v0.shape[-1], dtype, k0.device)
        self.steps = {}
        return self.cache

    def _step_for(self, key: StepKey, max_new_tokens: int, vocab: int) -> DecodeStep:
        s = self.steps.get(key)
        if s is not None and s.max_new_tokens >= max_new_tokens:
            return s
        s = DecodeStep(self.model, self.cache.first_rows(key.rows), key, max_new_tokens, vocab)
        if self.mode == "compiled":
            # one compiled step per bucket and sampling setting, all of one method: dynamo's default of 8
            # entries per code object would fall back to eager after the eighth
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
            s.forward = torch.compile(s.forward, backend=self.compile_backend, dynamic=False)
        if self.mode in ("captured", "compiled") and s.logits.is_cuda:
            self.cache.write_at.zero_()  # the warm-up steps write a column there: keep it inside the cache
            s.capture()
            self.graphs_recorded += 1
        self.steps[key] = s
        return s

    def prepare(self, prefill_cache, expand: torch.Tensor, attn: torch.Tensor, next_pos: torch.Tensor,
                logits: torch.Tensor, row_keys: np.ndarray, params, eos: tuple[int, ...]) -> tuple[DecodeStep, int]:
        """Load a prefilled batch into its bucket's state; returns the step and the batch's rows."""
        B, L = attn.shape
        dev = attn.device
        dtype = kv_cache_dtype(self.model, dev.type)
        R = bucket_rows(B)
        cache = self._storage(prefill_cache, R, L + params.max_new_tokens, dtype)
        key = StepKey(R, float(params.temperature), int(params.top_k), float(params.top_p), tuple(eos),
                      _autocast_state(dev.type))
        s = self._step_for(key, params.max_new_tokens, logits.shape[-1])
        for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
            src = prefill_cache.layers[layer]
            k[:B, :, :L].copy_(src.keys[expand])
            v[:B, :, :L].copy_(src.values[expand])
        s.mask.zero_()
        s.mask[:B, :L].copy_(attn.bool())
        s.mask[B:, 0] = True  # padding rows attend to one (finite) column
        s.logits.zero_()
        s.logits[:B].copy_(logits)
        s.keys.zero_()
        s.keys[:B].copy_(keys_as_int64(row_keys).to(dev))
        s.position.zero_()
        s.position[:B].copy_(next_pos)
        s.finished.zero_()
        s.finished[B:] = True
        s.length.zero_()
        s.t.zero_()
        cache.write_at.fill_(L)
        return s, B
