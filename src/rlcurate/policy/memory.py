"""Activation memory of a training micro-batch, counted from the architecture (chapter 5; appendix A1,
*Memory*). ``rlcurate plan`` builds a whole GPU plan on it; the trainer sizes its micro-batches with it
when ``micro_batch_memory_gib`` is set.

Activations per completion token of a training micro-batch, bf16 autocast over fp32 master weights,
with the trainer's own forward (:func:`rlcurate.policy.scoring.forward_logprobs`): what autograd keeps
for the backward pass of one decoder layer of the Qwen2/Llama family (d hidden, q = heads x head_dim,
k = kv_heads x head_dim, m = intermediate size; bytes per token):

    RMSNorm x 2            2 x (4d + 4d)     its fp32 input (the residual stream) and normalised output
    q, k, v projections    3 x 2d            autocast casts the fp32 input to bf16 once per projection
    rotary embedding       2 x (2q + 2k)     q and k, and their rotated halves, bf16
    attention (SDPA)       2q + 4k + 2q + 4h q, k, v in, the output and fp32 log-sum-exp out
    o projection           2q                its bf16 input
    MLP                    2 x 2d + 4 x 2m   gate/up inputs, gate and up outputs, silu(gate), the product

    per layer  a = 26d + 10q + 8k + 8m + 4h    (fp32 residual stream; h = attention heads)

The d-terms are confirmed by listing what autograd saves for one Qwen2.5-0.5B layer on the CPU
(``torch.autograd.graph.saved_tensors_hooks``): four fp32 [tokens x d] tensors of the two norms,
three bf16 inputs of q, k, v and two of gate and up.

Qwen3's RMSNorm of q and k per head adds 3(q + k) (fitted: a two-layer Qwen3-0.6B on the CPU).

plus the final norm and the output layer's input at every completion position (4d + 4d + 4d: the
chunked output layer keeps only its fp32 input, :func:`rlcurate.policy.scoring.token_logprobs`). With
gradient checkpointing each layer keeps only its fp32 input (4d) and one layer's activations exist at a
time in the backward pass. ``bench/bench_memory.py`` measures these on the CPU and on a GPU; the
appendix sets them side by side.
"""

from __future__ import annotations

__all__ = ["activation_bytes_per_token", "layer_bytes_per_token", "head_bytes_per_token", "ACTIVATION_MARGIN",
           "micro_batch_tokens_for", "layer_dims"]

# The formula's error on the H100 is -0.1 % to +1.8 % (bench/bench_memory.py, appendix A1); plans add this margin.
ACTIVATION_MARGIN = 1.05


def layer_dims(config) -> tuple[int, int, int, int, int]:
    """(d, q, k, m, h): hidden size, query width, key-value width, MLP width, attention heads."""
    d = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    return d, heads * head_dim, config.num_key_value_heads * head_dim, config.intermediate_size, heads


def layer_bytes_per_token(config) -> float:
    """Bytes one decoder layer keeps for the backward pass per token (module docstring)."""
    d, q, k, m, h = layer_dims(config)
    qk_norm = 3 * (q + k) if getattr(config, "model_type", "") == "qwen3" else 0
    return 26 * d + 10 * q + 8 * k + 8 * m + 4 * h + qk_norm


def head_bytes_per_token(config) -> float:
    """Bytes the final norm and the chunked output layer keep per completion token."""
    return 12 * config.hidden_size


def activation_bytes_per_token(config, gradient_checkpointing: bool = False) -> float:
    """Activation bytes per completion token of a micro-batch (module docstring)."""
    layers = config.num_hidden_layers
    if gradient_checkpointing:
        return layers * 4 * config.hidden_size + head_bytes_per_token(config)
    return layers * layer_bytes_per_token(config) + head_bytes_per_token(config)


def micro_batch_tokens_for(config, budget_bytes: float, gradient_checkpointing: bool = False) -> int:
    """The largest ``micro_batch_tokens`` whose activations stay within ``budget_bytes``: every token of a
    micro-batch is charged as a completion token (prompt positions cost less), with the margin
    :data:`ACTIVATION_MARGIN`."""
    per_token = ACTIVATION_MARGIN * activation_bytes_per_token(config, gradient_checkpointing)
    return max(1, int(budget_bytes // per_token))
