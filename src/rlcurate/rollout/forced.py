"""Recorded and teacher-forced rollouts: replays that do not depend on the processor (issue #26).

A sampled trajectory is not portable across processors. Two machines whose matrix kernels round
differently give logits that differ in the sixth digit; now and then the uniform number that draws a
token falls between the two machines' cumulative-probability boundaries, a different token is drawn,
and from that step on the runs are different runs. Comparing a re-run's metrics with a stored run
therefore tests the processor as much as the code.

The two engines here split the question in two:

* :class:`RecordingEngine` wraps any engine and keeps, for every ``generate`` call, the prompts (as
  token ids), the counts, the seed and the sampled tokens.
* :class:`ForcedEngine` serves those tokens again (teacher forcing): it checks that the trainer asks
  for the same prompts, scores every stored token with one forward pass of the current model, and
  returns completions whose log-probabilities are the current model's. Everything downstream (rewards,
  advantages, the loss, the gradient) is then computed by the current code on the recorded tokens.

The sampler is checked on the side: at every stored token the forced logits and the uniform number
of :func:`rlcurate.rollout.sampling.uniforms` go through :func:`~rlcurate.rollout.sampling.sample_next`
again. A different pick whose uniform lies within ``tie_margin`` of a boundary of the stored token's
cumulative-probability interval is a *near-tie* (counted and reported, the case that rounding
decides); a different pick farther away is a *mismatch* (the sampler or the model changed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from rlcurate.rollout.base import Completion, RolloutEngine, SamplingParams, find_stop
from rlcurate.rollout.sampling import row_keys, sample_next, step_uniforms, truncate_logits

__all__ = ["ForcedEngine", "RecordingEngine", "ReplayMismatch", "SamplerCheck", "TIE_MARGIN"]

TIE_MARGIN = 1e-6
"""How close (in cumulative probability, or in logits for greedy decoding) a uniform may fall to a
boundary of the stored token's interval for a different pick to count as a near-tie. The near-ties met
replaying every fixture under four kernel settings lay 0.5e-9 to 4.4e-9 from their boundary
(``data/bench/replay_kernels.json``); the margin leaves a factor of more than 200, and a changed sampler
(another temperature, a shifted uniform) moves picks much farther."""


class ReplayMismatch(AssertionError):
    """The trainer asked the forced engine for something the recording does not hold (other prompts,
    counts, seed or sampling parameters, or more calls): the code path changed."""


def _params_record(params: SamplingParams) -> dict[str, Any]:
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "max_new_tokens": params.max_new_tokens, "stop": list(params.stop)}


class RecordingEngine(RolloutEngine):
    """``inner`` with a log of its calls (``calls``: one dict per ``generate`` call with ``prompts``
    as token ids, ``counts``, ``seed``, ``params``, and per prompt the sampled ``tokens`` and ``finish``
    reasons of its completions). Everything else is ``inner``'s."""

    def __init__(self, inner: RolloutEngine):
        self.inner = inner
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name):  # encode, tokenizer, device, vocab_size, ...: the wrapped engine's
        return getattr(self.inner, name)

    def _generate(self, prompts, counts, params, seed, progress):
        out = self.inner._generate(prompts, counts, params, seed, progress)
        self.calls.append({
            "seed": seed, "counts": list(counts), "params": _params_record(params),
            "prompts": self.inner.encode(prompts),
            "tokens": [[list(c.token_ids) for c in comps] for comps in out],
            "finish": [[c.finish_reason for c in comps] for comps in out],
        })
        return out


@dataclass
class SamplerCheck:
    """What the forced engine found about the sampler: the number of ``tokens`` checked, and the
    ``near_ties`` and ``mismatches`` as ``(call, prompt, sample, position, distance)``."""

    tokens: int = 0
    near_ties: list[tuple[int, int, int, int, float]] = field(default_factory=list)
    mismatches: list[tuple[int, int, int, int, float]] = field(default_factory=list)


class ForcedEngine(RolloutEngine):
    """Serves the calls recorded by :class:`RecordingEngine` through the current ``inner.model``
    (teacher forcing; see the module docstring). ``check`` holds the sampler's agreement with the
    stored tokens; ``tie_margin`` is :data:`TIE_MARGIN` unless given."""

    def __init__(self, inner, calls: Sequence[dict[str, Any]], tie_margin: float = TIE_MARGIN):
        self.inner = inner
        self.calls = list(calls)
        self.served = 0
        self.tie_margin = float(tie_margin)
        self.check = SamplerCheck()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ the recorded call
    def _expected(self, prompts, counts, params, seed) -> dict[str, Any]:
        k = self.served
        if k >= len(self.calls):
            raise ReplayMismatch(f"generate call {k + 1}: the recording holds only {len(self.calls)} call(s)")
        call = self.calls[k]
        ids = self.inner.encode(prompts)
        for what, now, then in (("seed", seed, call["seed"]), ("counts", list(counts), call["counts"]),
                                ("sampling parameters", _params_record(params), call["params"])):
            if now != then:
                raise ReplayMismatch(f"generate call {k + 1}: {what} {now!r}, recorded {then!r}")
        if ids != call["prompts"]:
            bad = next(i for i, (a, b) in enumerate(zip(ids + [None] * len(call["prompts"]), call["prompts"]))
                       if a != b)
            raise ReplayMismatch(f"generate call {k + 1}: prompt {bad} differs from the recording "
                                 f"({len(ids)} prompts now, {len(call['prompts'])} recorded)")
        self.served += 1
        return call

    def _generate(self, prompts, counts, params, seed, progress):
        call = self._expected(prompts, counts, params, seed)
        model = self.inner.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                logits = self._logits(call["prompts"], call["tokens"])
                return [self._force_prompt(self.served - 1, i, ids, call["tokens"][i], call["finish"][i],
                                           params, seed, logits[i])
                        for i, ids in enumerate(call["prompts"])]
        finally:
            model.train(was_training)

    # ------------------------------------------------------------------ one prompt's completions
    def _force_prompt(self, k, i, prompt_ids, tokens, finishes, params, seed, logits) -> list[Completion]:
        out = []
        for j, (toks, z) in enumerate(zip(tokens, logits)):
            self._check_sampler(k, i, j, toks, z, params, seed)
            scaled = z.float() / (params.temperature if params.temperature > 0 else 1.0)
            lps = torch.log_softmax(scaled, dim=-1).gather(-1, torch.tensor(toks, device=z.device)[:, None])
            text, finish = self._text(toks, params)
            if finish != finishes[j]:
                raise ReplayMismatch(f"generate call {k + 1}, prompt {i}, sample {j}: the stored tokens end with "
                                     f"{finish!r} now, recorded {finishes[j]!r}")
            out.append(Completion(prompt_index=i, sample_index=j, prompt_token_ids=list(prompt_ids),
                                  token_ids=list(toks), text=text, logprobs=lps.squeeze(-1).tolist(),
                                  finish_reason=finish))
        return out

    # ------------------------------------------------------------------ the logits of a call
    def _logits(self, prompts: list[list[int]], tokens: list[list[list[int]]]) -> list[list[torch.Tensor]]:
        """Next-token logits at every stored token, [len(toks), V] per completion of each prompt, one prompt
        at a time. A prompt longer than its completions (a chat prompt: SmolLM2's 130 tokens before at most
        8) goes through the model once and its keys and values serve every completion
        (:meth:`_logits_over_prompt`: half the time of a SmolLM2 replay); a shorter one goes with each
        completion, right-padded, in one pass (:meth:`_logits_of_rows`; on the tiny models a second pass
        costs more than the prompt's repeats, and one pass over many prompts' padded rows was no faster)."""
        out: list[list[torch.Tensor]] = []
        for ids, toks in zip(prompts, tokens):
            if not toks:
                out.append([])
            elif len(ids) > max(len(t) for t in toks):
                out.append(self._logits_over_prompt(ids, toks))
            else:
                out.append(self._logits_of_rows(ids, toks))
        return out

    def _logits_of_rows(self, prompt_ids: list[int], tokens: list[list[int]]) -> list[torch.Tensor]:
        """The logits of one prompt's completions in one pass: the prompt and each completion, right-padded."""
        dev = self.inner.device
        P, T = len(prompt_ids), max(len(t) for t in tokens)
        ids = torch.full((len(tokens), P + T), self.inner.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r, toks in enumerate(tokens):
            ids[r, : P + len(toks)] = torch.tensor(list(prompt_ids) + list(toks))
            attn[r, : P + len(toks)] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        z = self.inner.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                             logits_to_keep=T + 1).logits  # positions P-1 .. P+T-1
        return [z[r, : len(toks)] for r, toks in enumerate(tokens)]

    def _logits_over_prompt(self, prompt_ids: list[int], tokens: list[list[int]]) -> list[torch.Tensor]:
        """The logits of one prompt's completions over the prompt's cached keys and values, as the sampling
        engine scored them after its prefill: the prompt's last logits score each completion's first token,
        then the completions, right-padded, go in one pass over the cache."""
        dev = self.inner.device
        model = self.inner.model
        P, T, N = len(prompt_ids), max(len(t) for t in tokens), len(tokens)
        head = model(input_ids=torch.tensor([list(prompt_ids)], device=dev), use_cache=True, logits_to_keep=1)
        first = head.logits[0, -1:]  # position P-1: the first token's logits, the same for every row
        if T == 1:
            return [first for _ in tokens]
        cache = head.past_key_values
        cache.batch_repeat_interleave(N)
        ids = torch.full((N, T - 1), self.inner.pad_token_id, dtype=torch.long)
        attn = torch.zeros((N, P + T - 1), dtype=torch.long)
        attn[:, :P] = 1
        for r, toks in enumerate(tokens):
            ids[r, : len(toks) - 1] = torch.tensor(list(toks[:-1]), dtype=torch.long)
            attn[r, P : P + len(toks) - 1] = 1
        pos = torch.arange(P, P + T - 1).expand(N, -1)
        z = model(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev), past_key_values=cache,
                  use_cache=True).logits  # positions P .. P+T-2
        return [torch.cat([first, z[r, : len(toks) - 1]]) for r, toks in enumerate(tokens)]

    def _text(self, toks: list[int], params: SamplingParams) -> tuple[str, str]:
        """The completion's text and finish reason as the sampling engine would give them."""
        tok = self.inner.tokenizer
        if toks and toks[-1] in self.inner.eos_token_ids:
            return tok.decode(toks[:-1], skip_special_tokens=False), "stop"
        text = tok.decode(toks, skip_special_tokens=False)
        end = find_stop(text, params.stop) if params.stop else -1
        if end >= 0:
            return text[:end], "stop"
        return text, "length"

    def _check_sampler(self, k, i, j, toks, z, params: SamplingParams, seed: int) -> None:
        T = len(toks)
        key = row_keys(seed, [i], [j])
        u = torch.from_numpy(step_uniforms(key, np.arange(T, dtype=np.uint64)))  # the row's stream, tokens 0..T-1
        picked, _ = sample_next(z, params.temperature, params.top_k, params.top_p, u)
        stored = torch.tensor(toks, device=z.device)
        self.check.tokens += T
        for t in (picked != stored).nonzero().flatten().tolist():
            d = self._distance(z[t], toks[t], float(u[t]), params)
            (self.check.near_ties if d <= self.tie_margin else self.check.mismatches).append((k, i, j, t, d))

    @staticmethod
    def _distance(z: torch.Tensor, token: int, u: float, params: SamplingParams) -> float:
        """How far the uniform lies outside the stored token's interval of the inverse CDF (for greedy
        decoding: how far the stored token's logit lies below the largest)."""
        if params.temperature == 0:
            return float(z.max() - z[token])
        scaled = z.float() / params.temperature
        probs = torch.softmax(truncate_logits(scaled[None], params.top_k, params.top_p).double(), dim=-1)[0]
        cdf = torch.cumsum(probs, dim=-1)
        target = u * float(cdf[-1])
        lower = float(cdf[token - 1]) if token > 0 else 0.0
        upper = float(cdf[token])
        return lower - target if target < lower else max(target - upper, 0.0)
