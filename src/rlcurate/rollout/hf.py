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

from .base import Completion, Prompt, RolloutEngine, SamplingParams, find_stop
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


def _static_cache(config, dynamic, max_len: int):
    """A ``transformers.StaticCache`` of ``max_len`` columns holding the prompt's keys and values from the
    prefill's ``dynamic`` cache (already expanded to one row per sample): decode steps then write into
    preallocated tensors and keep their shapes."""
    from transformers import StaticCache

    static = StaticCache(config=config, max_cache_len=max_len)
    for src, dst in zip(dynamic.layers, static.layers):
        n = src.keys.shape[-2]
        dst.lazy_initialization(src.keys, src.values)
        dst.keys[:, :, :n].copy_(src.keys)
        dst.values[:, :, :n].copy_(src.values)
        dst.cumulative_length.fill_(n)
    return static


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
        cache: ``"dynamic"`` (default): the KV cache grows by one column per step. ``"static"``: it is
            allocated once at its final length (``transformers.StaticCache``) and every decode step
            has the same shapes, which is what ``torch.compile`` and CUDA graphs need; the rows are
            not pruned. The sampled tokens are the same (tests/test_rollout_static.py).
        compile_decode: with ``cache="static"``, compile the one-token forward with
            ``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU, where eager decoding is
            launch-bound: appendix A1). It compiles again when shapes change (with dynamic shapes after
            the second); each batch has its own cache, so on a GPU its CUDA graphs are re-recorded batch by
            batch. Not yet timed on a GPU.
    """

    def __init__(
        self,
        model,
        tokenizer,
        token_budget: int = 16384,
        eos_token_ids: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        prune_finished: bool = True,
        cache: str = "dynamic",
        compile_decode: bool = False,
    ):
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
            raise ValueError(f"token_budget must be a positive integer, got {token_budget!r}")
        if cache not in ("dynamic", "static"):
            raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
        if compile_decode and cache != "static":
            raise ValueError("compile_decode needs cache='static' (a growing cache changes shape every step)")
        self.cache = cache
        self._decode = torch.compile(model.forward, mode="reduce-overhead") if compile_decode else model.forward
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
    def _generate(self, prompts, counts, params, seed, progress):
        prompt_ids = self.encode(prompts)
        results: list[list[Completion | None]] = [[None] * c for c in counts]
        batches = plan_batches([len(p) for p in prompt_ids], counts, params.max_new_tokens, self.token_budget)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), tqdm(total=sum(counts), unit="completion", disable=not progress,
                                              desc="rollout") as bar:
                for rows in batches:
                    for c in self._generate_batch(rows, prompt_ids, params, seed):
                        results[c.prompt_index][c.sample_index] = c
                    bar.update(len(rows))
        finally:
            self.model.train(was_training)
        return results

    def _generate_batch(self, rows, prompt_ids, params: SamplingParams, seed: int) -> list[Completion]:
        dev = self.device
        B = len(rows)
        uniq = list(dict.fromkeys(i for i, _ in rows))
        slot = {i: k for k, i in enumerate(uniq)}
        static = self.cache == "static"
        # each distinct prompt once, the beginning they share once (a system turn, few-shot examples)
        out, attn, pos = prefill_prompts(self.model, [prompt_ids[i] for i in uniq], self.pad_token_id, dev,
                                         logits_to_keep=1)
        L = attn.shape[1]
        past = out.past_key_values
        expand = torch.tensor([slot[i] for i, _ in rows], device=dev)
        logits = out.logits[:, -1, :][expand]
        if len(uniq) < B:  # share each prompt's KV cache among its samples
            past.batch_select_indices(expand)
        if static:
            past = _static_cache(self.model.config, past, L + params.max_new_tokens)
        # the attention mask of the whole decode, allocated once: step t attends to the first L + t + 1
        # columns (a growing cache would otherwise concatenate one column at every step)
        attn = torch.cat([attn[expand], attn.new_ones((B, max(params.max_new_tokens - 1, 0)))], dim=1)
        next_pos = pos[expand, -1] + 1

        keys = row_keys(seed, [i for i, _ in rows], [j for _, j in rows])  # uniforms(seed, i, j, t), per t
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
            if params.stop:
                self._check_stop(rows_now, gen, reason, cut, params.stop)
            live = [k for k, r in enumerate(rows_now) if reason[r] is None]
            if not live or t == params.max_new_tokens - 1:
                break
            if not static and self.prune_finished and 4 * (len(rows_now) - len(live)) >= len(rows_now):
                keep = torch.tensor(live, device=dev)
                past.batch_select_indices(keep)
                attn, next_pos, tok, cur = attn[keep], next_pos[keep], tok[keep], cur[keep.cpu()]
            if static:  # fixed shapes: the whole mask (the causal mask hides the unwritten columns)
                out = self._decode(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                   past_key_values=past, use_cache=True,
                                   cache_position=torch.full((1,), L + t, dtype=torch.long, device=dev))
            else:
                out = self.model(input_ids=tok[:, None], attention_mask=attn[:, : L + t + 1],
                                 position_ids=next_pos[:, None], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
            next_pos = next_pos + 1

        for r in range(B):
            reason[r] = reason[r] or "length"
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

    def _check_stop(self, rows_now, gen, reason, cut, stop):
        active = [r for r in rows_now if reason[r] is None]
        if not active:
            return
        texts = self.tokenizer.batch_decode([gen[r] for r in active], skip_special_tokens=False)
        for r, text in zip(active, texts):
            end = find_stop(text, stop)
            if end >= 0:
                reason[r], cut[r] = "stop", end
