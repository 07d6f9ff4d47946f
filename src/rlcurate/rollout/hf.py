"""The default rollout backend: a hand-written decode loop over a Hugging Face causal LM (chapter 4).

Why not ``model.generate``: a checkpoint's ``generation_config`` (top_k=50, repetition penalty, ...)
silently changes the distribution ``generate`` samples from, while the trainer needs the log-probs of
the distribution it actually sampled from. The loop below applies exactly the given
:class:`~rlcurate.rollout.base.SamplingParams` and nothing else. With a KV cache it is as fast as
``generate`` on CPU (see ``data/throughput/tiny_cpu.json`` and ``bench/bench_rollout.py``).
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch
from tqdm import tqdm

from rlcurate.models.prefill import prefill_prompts

from .base import DECODE_MODES, Completion, Prompt, RolloutEngine, SamplingParams, find_stop
from .fixed_shape import FixedShapeDecoder, kv_cache_dtype
from .sampling import row_keys, sample_next, step_uniforms

log = logging.getLogger(__name__)


def plan_batches(lengths: Sequence[int], counts: Sequence[int], max_new_tokens: int, token_budget: int):
    """Group the rows ``(prompt i, sample j)`` into batches that fit ``token_budget`` (chapter 4).

    A batch of ``B`` rows whose longest prompt has ``L`` tokens is charged ``B * (L + max_new_tokens)``
    tokens, which is what its left-padded KV cache holds at the end; it must not exceed the budget.
    Prompts are taken longest first so that a batch holds prompts of similar length (little
    padding), and the samples of one prompt stay together so that their prompt is encoded once. A
    single row larger than the budget gets a batch of its own. Returns a list of lists of ``(i, j)``.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, cur, cur_len = [], [], 0
    for i in order:
        for j in range(counts[i]):
            if cur and (len(cur) + 1) * (cur_len + max_new_tokens) > token_budget:
                batches.append(cur)
                cur = []
            if not cur:
                cur_len = lengths[i]
            cur.append((i, j))
    if cur:
        batches.append(cur)
    return batches


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


class TransformersEngine(RolloutEngine):
    """Samples completions from a Hugging Face causal LM with a KV-cached decode loop (chapter 4).

    Rows (one per prompt and sample) are batched under a token budget (:func:`plan_batches`), prompts
    are left-padded with position ids taken from the attention mask, and each distinct prompt of a
    batch is encoded once and its KV cache shared by its samples, the beginning all its prompts share
    encoded once for the batch (:func:`rlcurate.models.prefill.prefill_prompts`). Token ``t`` of sample ``j`` of
    prompt ``i`` is drawn with the uniform number ``uniforms(seed, i, j, t)``, so a completion does not
    depend on the batching: the same prompts, counts and seed give identical completions whatever the
    token budget (up to float rounding between batch shapes, which can flip a near-tie).

    Args:
        model: a ``transformers`` causal LM (``Qwen2ForCausalLM`` and the like); its
            ``generation_config`` sampling defaults are ignored.
        tokenizer: the matching tokenizer (used to encode text prompts, decode completions and find
            stop strings).
        token_budget: the most tokens (prompt plus ``max_new_tokens``, padded) one batch may hold.
        eos_token_ids: tokens that end a completion; by default the tokenizer's EOS token together
            with the ``eos_token_id`` of the model's ``generation_config`` (instruct checkpoints list
            several).
        pad_token_id: the id used for left padding (never attended to); default the tokenizer's pad
            token, else the first EOS token, else 0.
        prune_finished: drop finished rows from the batch (and its KV cache) once a quarter of the
            rows have finished, so short answers do not pay for long ones (dynamic cache only).
        decode: how the tokens after the prompt are decoded (appendix A1, *Benchmarks*). ``"dynamic"``
            (default): the KV cache grows by one column a step and finished rows are pruned. The others
            decode with fixed shapes (:mod:`rlcurate.rollout.fixed_shape`): one persistent KV cache per
            engine, each batch run in the bucket of rows of the next power of two, the host looking at
            the rows only every ``sync_every`` steps. ``"static"`` runs that step eagerly; ``"captured"``
            records it once per bucket as a CUDA graph and replays it (eager on a CPU); ``"compiled"``
            compiles its one-token forward with ``torch.compile`` (the sampler stays eager) and, on a GPU,
            replays the step as a CUDA graph.
            Every path draws the same uniforms, so they sample the same tokens (up to float rounding
            between kernels, which can flip a near-tie; tests/test_rollout_static.py).
        sync_every: with fixed shapes, how many steps run between two looks at the finished rows and the
            stop strings (a finished row idles for at most this many steps).
        rollout_dtype: decode with a copy of ``model``'s parameters in this dtype (``torch.bfloat16``:
            what the trainer's fp32 weights are cast to under autocast anyway, read at half the bytes),
            refreshed in place from ``model`` at the start of every ``generate`` call, so it never lags
            an optimizer step; buffers (the rotary frequencies) stay as they are. Its sampling
            distribution differs from ``model``'s under autocast by rounding (the residual stream is
            bf16), which the trainer's importance ratio sees, as it would a separate inference engine's.
    """

    def __init__(
        self,
        model,
        tokenizer,
        token_budget: int = 16384,
        eos_token_ids: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        prune_finished: bool = True,
        decode: str = "dynamic",
        sync_every: int = 8,
        rollout_dtype: torch.dtype | None = None,
    ):
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
            raise ValueError(f"token_budget must be a positive integer, got {token_budget!r}")
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"sync_every must be a positive integer, got {sync_every!r}")
        self.decode = decode
        self.source = model
        if rollout_dtype is not None and rollout_dtype != next(model.parameters()).dtype:
            model = _parameters_copy(model, rollout_dtype)
        self.fixed = FixedShapeDecoder(model, decode, sync_every) if decode != "dynamic" else None
        self.model = model
        self.tokenizer = tokenizer
        self.token_budget = token_budget
        self.prune_finished = bool(prune_finished)
        if eos_token_ids is None:
            eos = _as_id_list(getattr(tokenizer, "eos_token_id", None))
            gen_cfg = getattr(model, "generation_config", None)
            eos += [e for e in _as_id_list(getattr(gen_cfg, "eos_token_id", None)) if e not in eos]
        else:
            eos = _as_id_list(eos_token_ids)
        self.eos_token_ids = tuple(eos)
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = eos[0] if eos else 0
        self.pad_token_id = int(pad_token_id)
        self.vocab_size = model.get_input_embeddings().num_embeddings

    def refresh_weights(self) -> None:
        """Copy the source model's parameters into the rollout copy (``rollout_dtype``), in place (a CUDA
        graph recorded on them stays valid); nothing to do without a copy."""
        if self.model is self.source:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), self.source.parameters()):
                dst.copy_(src)

    @classmethod
    def from_pretrained(cls, path: str, dtype=None, device: str | None = None, **kwargs) -> "TransformersEngine":
        """An engine for a checkpoint directory or Hub id (chapter 4), loaded with
        ``AutoModelForCausalLM`` (float32 unless ``dtype`` is given) and ``AutoTokenizer``."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        if device is not None:
            model = model.to(device)
        return cls(model.eval(), AutoTokenizer.from_pretrained(path), **kwargs)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live; batches are built there."""
        return next(self.model.parameters()).device

    # ---------------------------------------------------------------- prompts
    def encode(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Token ids of each prompt (chapter 4): text is encoded without adding special tokens."""
        out = []
        for i, p in enumerate(prompts):
            ids = self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else list(p)
            if not ids:
                raise ValueError(f"prompts[{i}] encodes to no tokens; a prompt needs at least one token")
            if max(ids) >= self.vocab_size:
                raise ValueError(f"prompts[{i}] holds token id {max(ids)}, outside the model's vocabulary "
                                 f"of {self.vocab_size} tokens")
            out.append(ids)
        return out

    # ---------------------------------------------------------------- generation
    accepts_hook = True

    def _generate(self, prompts, counts, params, seed, progress, hook=None):
        prompt_ids = self.encode(prompts)
        results: list[list[Completion | None]] = [[None] * c for c in counts]
        batches = plan_batches([len(p) for p in prompt_ids], counts, params.max_new_tokens, self.token_budget)
        self.refresh_weights()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), tqdm(total=sum(counts), unit="completion", disable=not progress,
                                              desc="rollout") as bar:
                for rows in batches:
                    if hook is not None:
                        hook(True)  # between batches nothing of this call is in flight
                    for c in self._generate_batch(rows, prompt_ids, params, seed, hook):
                        results[c.prompt_index][c.sample_index] = c
                    bar.update(len(rows))
        finally:
            self.model.train(was_training)
        return results

    def _generate_batch(self, rows, prompt_ids, params: SamplingParams, seed: int, hook=None) -> list[Completion]:
        dev = self.device
        uniq = list(dict.fromkeys(i for i, _ in rows))
        slot = {i: k for k, i in enumerate(uniq)}
        # each distinct prompt once, the beginning they share once (a system turn, few-shot examples)
        out, attn, pos = prefill_prompts(self.model, [prompt_ids[i] for i in uniq], self.pad_token_id, dev,
                                         logits_to_keep=1)
        expand = torch.tensor([slot[i] for i, _ in rows], device=dev)
        logits = out.logits[:, -1, :][expand]
        keys = row_keys(seed, [i for i, _ in rows], [j for _, j in rows])  # uniforms(seed, i, j, t), per t
        scanner = StopScanner(self.tokenizer, params.stop) if params.stop else None
        if self.fixed is not None:
            gen, lps, reason, cut = self._decode_fixed(out.past_key_values, expand, attn[expand], pos[expand, -1] + 1,
                                                       logits, keys, params, scanner, hook)
        else:
            gen, lps, reason, cut = self._decode_dynamic(out.past_key_values, expand, len(uniq), attn[expand],
                                                         pos[expand, -1] + 1, logits, keys, params, scanner, hook)
        texts = self.tokenizer.batch_decode(
            [g[:-1] if reason[r] == "stop" and cut[r] is None else g for r, g in enumerate(gen)],
            skip_special_tokens=False)
        return [
            Completion(
                prompt_index=i, sample_index=j, prompt_token_ids=list(prompt_ids[i]), token_ids=gen[r],
                text=texts[r] if cut[r] is None else texts[r][: cut[r]], logprobs=lps[r],
                finish_reason=reason[r],
            )
            for r, (i, j) in enumerate(rows)
        ]

    def _decode_dynamic(self, past, expand, n_uniq, attn, next_pos, logits, keys, params, scanner, hook=None):
        """The growing-cache loop: one forward per token, finished rows pruned (``prune_finished``)."""
        dev = attn.device
        B, L = attn.shape
        if n_uniq < B:  # share each prompt's KV cache among its samples
            past.batch_select_indices(expand)
        _store_cache_as(past, kv_cache_dtype(self.model, dev.type))
        # the attention mask of the whole decode, allocated once: step t attends to the first L + t + 1
        # columns (a growing cache would otherwise concatenate one column at every step)
        attn = torch.cat([attn, attn.new_ones((B, max(params.max_new_tokens - 1, 0)))], dim=1)
        gen: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        reason: list[str | None] = [None] * B
        cut: list[int | None] = [None] * B  # text length after a stop string
        cur = torch.arange(B)  # global row of each row of the current (possibly pruned) batch
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=dev)

        for t in range(params.max_new_tokens):
            rows_now = cur.tolist()
            u = step_uniforms(keys[rows_now], t)
            tok, lp = sample_next(logits, params.temperature, params.top_k, params.top_p, u)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            is_eos = torch.isin(tok, eos).tolist() if len(eos) else [False] * len(rows_now)
            for k, r in enumerate(rows_now):
                if reason[r] is None:
                    gen[r].append(tok_l[k])
                    lps[r].append(lp_l[k])
                    if is_eos[k]:
                        reason[r] = "stop"
            if scanner is not None:
                active = [r for r in rows_now if reason[r] is None]
                for r, (s, end) in scanner.first_stops([gen[r] for r in active], [t] * len(active), t + 1).items():
                    reason[active[r]], cut[active[r]] = "stop", end
            live = [k for k, r in enumerate(rows_now) if reason[r] is None]
            if not live or t == params.max_new_tokens - 1:
                break
            if hook is not None:
                hook(True)  # this loop's state is its own: another call may run before the next step
            if self.prune_finished and 4 * (len(rows_now) - len(live)) >= len(rows_now):
                keep = torch.tensor(live, device=dev)
                past.batch_select_indices(keep)
                attn, next_pos, tok, cur = attn[keep], next_pos[keep], tok[keep], cur[keep.cpu()]
            out = self.model(input_ids=tok[:, None], attention_mask=attn[:, : L + t + 1],
                             position_ids=next_pos[:, None], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
            next_pos = next_pos + 1
        return gen, lps, [r or "length" for r in reason], cut

    def _decode_fixed(self, past, expand, attn, next_pos, logits, keys, params, scanner, hook=None):
        """The fixed-shape loop (:mod:`rlcurate.rollout.fixed_shape`): the step runs ``sync_every`` times
        between two reads of the finished flags (and of the new tokens, when there are stop strings)."""
        step, B = self.fixed.prepare(past, expand, attn, next_pos, logits, keys, params, self.eos_token_ids)
        T = params.max_new_tokens
        stopped: dict[int, tuple[int, int]] = {}  # row -> (step of the stop string, text cut)
        t = 0
        while True:
            n = min(self.fixed.sync_every, T - t)
            for _ in range(n):
                step.run()
            t += n
            finished, length = step.finished[:B].tolist(), step.length[:B].tolist()
            if scanner is not None:  # among the new tokens, before an end-of-sequence token
                tokens = step.tokens[:B, :t].tolist()
                active = [r for r in range(B) if r not in stopped]
                ends = [length[r] - 1 if finished[r] else t for r in active]
                for k, hit in scanner.first_stops([tokens[r] for r in active], [t - n] * len(active), ends).items():
                    stopped[active[k]] = hit
            if t >= T or all(f or r in stopped for r, f in enumerate(finished)):
                break
            if hook is not None:
                hook(False)  # the fixed-shape buffers are shared by every call: no other may run before this ends
        tokens, logprobs = step.tokens[:B, :t].tolist(), step.logprobs[:B, :t].tolist()
        gen, lps, reason, cut = [], [], [], []
        for r in range(B):
            if r in stopped:
                m, why, c = stopped[r][0] + 1, "stop", stopped[r][1]
            elif finished[r]:
                m, why, c = length[r], "stop", None
            else:
                m, why, c = t, "length", None
            gen.append(tokens[r][:m])
            lps.append(logprobs[r][:m])
            reason.append(why)
            cut.append(c)
        return gen, lps, reason, cut



def _parameters_copy(model, dtype):
    """A copy of ``model`` whose parameters (not its buffers) are in ``dtype``, gradients off."""
    import copy

    clone = copy.deepcopy(model)
    for p in clone.parameters():
        p.requires_grad_(False)
        p.data = p.data.to(dtype)
    return clone.eval()


def _store_cache_as(cache, dtype) -> None:
    """Keep a growing cache's keys and values in ``dtype`` (:func:`kv_cache_dtype`): under autocast the
    layers would otherwise keep fp32 keys (the rotary embedding's output), twice the planner's bytes."""
    for layer in getattr(cache, "layers", ()):
        if type(layer) is DynamicLayer and layer.keys is not None and layer.keys.dtype != dtype:
            layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
            layer.__class__ = _TypedDynamicLayer


def _typed_dynamic_layer():
    from transformers.cache_utils import DynamicLayer

    class TypedDynamicLayer(DynamicLayer):
        """A ``DynamicLayer`` that casts what it appends to the dtype it holds."""

        def update(self, key_states, value_states, *args, **kwargs):
            return super().update(key_states.to(self.keys.dtype), value_states.to(self.values.dtype), *args, **kwargs)

    return DynamicLayer, TypedDynamicLayer


DynamicLayer, _TypedDynamicLayer = _typed_dynamic_layer()


class StopScanner:
    """Finds where stop strings end a completion without decoding its whole text at every step (chapter 4).

    A stop string that first appears among the tokens ``start .. end - 1`` ends within their text, so it
    lies in the decoded text of those tokens and the ``window`` tokens before them (``window`` = the
    longest stop string's length plus 8, a token decoding to at least one character but for the pieces
    of a multi-byte character). Only a row whose window holds a stop string is decoded from its start,
    token by token, to find the first step ``s`` at which ``find_stop(decode(tokens[:s + 1]))`` holds and
    the text's cut there, exactly as checking the whole text after every token would.
    """

    def __init__(self, tokenizer, stop):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.window = max(len(x) for x in self.stop) + 8

    def _decode(self, ids):
        return self.tokenizer.batch_decode(ids, skip_special_tokens=False)

    def first_stops(self, rows: list[list[int]], starts, ends) -> dict[int, tuple[int, int]]:
        """``{k: (s, cut)}`` for each row ``k`` of ``rows`` in which a stop string first ends at a step
        ``s`` in ``[starts[k], ends[k])`` (``ends`` a list or one number)."""
        if isinstance(ends, int):
            ends = [ends] * len(rows)
        todo = [k for k in range(len(rows)) if ends[k] > starts[k]]
        tails = self._decode([rows[k][max(0, starts[k] - self.window): ends[k]] for k in todo])
        hits = {}
        for k, tail in zip(todo, tails):
            if find_stop(tail, self.stop) < 0:
                continue
            for s in range(starts[k], ends[k]):
                end = find_stop(self._decode([rows[k][: s + 1]])[0], self.stop)
                if end >= 0:
                    hits[k] = (s, end)
                    break
        return hits
