"""The rollout interface shared by every generation backend (chapter 4, *The variance audit*).

A rollout engine takes a list of prompts and a number of samples per prompt and returns, for each
prompt, that many sampled completions with the log-probability of every sampled token. The variance
audit (chapter 4) calls it to estimate pass rates; the GRPO trainer (chapters 5-9) calls it once per
step, and adaptive samplers call it again with a different ``n`` per prompt.

Conventions shared by all backends (each backend's docstring says where it cannot honour one):

* **Prompts** are text already rendered with any chat template, or token ids. Text is encoded with
  ``add_special_tokens=False``: a rendered template already holds the special tokens it needs.
* **Log-probabilities.** ``Completion.logprobs[t]`` is ``log softmax(z_t / T)[a_t]``: the logits
  ``z_t`` of the model at step ``t`` divided by the temperature ``T``, normalised over the *whole*
  vocabulary, read at the sampled token ``a_t``; that is, *before* top-k / top-p truncation. With
  ``top_k=0`` and ``top_p=1`` (the setting RL training uses) this is exactly the distribution the token
  was drawn from. It is also what a trainer recomputes with a forward pass, so the importance ratio
  pi_theta / pi_old is exactly 1 at the sampling policy. Under greedy decoding (``T = 0``) the value
  is ``log softmax(z_t)[a_t]``, the model's own (temperature 1) log-probability.
* **Stopping.** A completion ends with ``finish_reason="stop"`` when it samples an end-of-sequence
  token or when its text first contains one of ``SamplingParams.stop``; otherwise it ends with
  ``"length"`` after ``max_new_tokens`` tokens. The EOS token is *kept* in ``token_ids`` (a trainer
  must learn to stop) but not in ``text``. A stop string is *included*: ``token_ids`` end with the
  token that completed the stop string, and ``text`` ends right after the stop string.
"""

from __future__ import annotations

import abc
import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

Prompt = Union[str, Sequence[int]]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions; applied exactly, with no hidden defaults (chapter 4).

    Attributes:
        temperature: divides the logits; ``0`` means greedy decoding (argmax).
        top_p: nucleus sampling, keep the smallest set of most likely tokens whose probability
            reaches ``top_p``; ``1.0`` keeps the whole vocabulary. Must lie in (0, 1].
        top_k: keep only the ``top_k`` most likely tokens; ``0`` means no top-k truncation.
        max_new_tokens: the most tokens a completion may have (>= 1).
        stop: strings that end a completion (included in its text, see the module docstring).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0 < p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got {p!r}")
        for name, minimum in (("top_k", 0), ("max_new_tokens", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0``: every completion is the argmax continuation."""
        return self.temperature == 0


@dataclass
class Completion:
    """One sampled completion of one prompt (chapter 4).

    Attributes:
        prompt_index: position of the prompt in the list given to ``generate``.
        sample_index: 0 .. n-1 within that prompt.
        prompt_token_ids: the prompt as the model saw it (empty if a backend cannot report it).
        token_ids: the sampled tokens, including a final EOS token when the model stopped on one.
        text: the decoded completion, without the EOS token; ends right after a stop string.
        logprobs: one float per entry of ``token_ids``, ``log softmax(logits / T)`` at the sampled
            token, before top-k/top-p truncation (see the module docstring).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (``max_new_tokens`` reached).
    """

    prompt_index: int
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float] = field(repr=False)
    finish_reason: str

    @property
    def num_tokens(self) -> int:
        """Number of generated tokens (what compute accounting counts)."""
        return len(self.token_ids)


def _as_prompt(p, i: int) -> Prompt:
    if isinstance(p, str):
        return p
    if isinstance(p, (bytes, bytearray)) or not isinstance(p, Sequence) and not hasattr(p, "tolist"):
        raise ValueError(f"prompts[{i}] must be a string or a sequence of token ids, got {type(p).__name__}")
    ids = p.tolist() if hasattr(p, "tolist") else list(p)
    if not ids:
        raise ValueError(f"prompts[{i}] is an empty list of token ids")
    if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 for t in ids):
        raise ValueError(f"prompts[{i}] must hold non-negative integer token ids, got {ids!r}")
    return [int(t) for t in ids]


def normalize_request(prompts, n) -> tuple[list[Prompt], list[int]]:
    """Check ``prompts`` and ``n`` and return ``(prompts, counts)`` with one count per prompt.

    ``n`` is one integer for every prompt or a sequence with one integer per prompt; counts may be 0.
    Raises ``ValueError`` naming the bad argument.
    """
    if isinstance(prompts, (str, bytes)):
        raise ValueError("prompts must be a list of prompts, got a single string; wrap it in a list")
    try:
        prompts = list(prompts)
    except TypeError as exc:
        raise ValueError(f"prompts must be a list of prompts, got {type(prompts).__name__}") from exc
    prompts = [_as_prompt(p, i) for i, p in enumerate(prompts)]
    if isinstance(n, numbers.Integral) and not isinstance(n, bool):
        counts = [int(n)] * len(prompts)
    else:
        try:
            counts = list(n.tolist() if hasattr(n, "tolist") else n)
        except TypeError as exc:
            raise ValueError(f"n must be an integer or one integer per prompt, got {n!r}") from exc
        if len(counts) != len(prompts):
            raise ValueError(f"n has {len(counts)} entries but there are {len(prompts)} prompts")
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0:
            raise ValueError(f"n must hold non-negative integers, got {c!r}")
    return prompts, [int(c) for c in counts]


def check_seed(seed) -> int:
    """Return ``seed`` as an int, raising ``ValueError`` unless it is a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def prompt_seed(seed: int, prompt_index: int) -> int:
    """A 63-bit seed for one prompt, mixed from the call's ``seed`` and the prompt's position.

    Backends that seed per request (vLLM, an OpenAI-compatible server) use it so that different
    prompts get unrelated random streams and a prompt's samples do not depend on how requests are
    grouped. SplitMix64 mixing, as in :func:`rlcurate.rollout.sampling.uniforms`.
    """
    def mix(x: int) -> int:
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return x ^ (x >> 31)

    # Hash the seed before the index enters: XOR-ing them first would make (s, i) and (s ^ 1, i ^ 1)
    # collide.
    x = mix(seed & 0xFFFFFFFFFFFFFFFF)
    x = mix(x ^ (prompt_index & 0xFFFFFFFFFFFFFFFF))
    x = mix(x ^ 0x5EED)
    return x >> 1


DECODE_MODES = ("dynamic", "static", "captured", "compiled")
"""The decode paths of :class:`rlcurate.rollout.TransformersEngine` (appendix A1, *Benchmarks*)."""

def find_stop(text: str, stop: Sequence[str]) -> int:
    """Index just past the earliest-ending stop string in ``text``, or -1 if none occurs.

    Earliest *end* decides, since that is the first point at which generation would have stopped.
    """
    best = -1
    for s in stop:
        k = text.find(s)
        if k >= 0 and (best < 0 or k + len(s) < best):
            best = k + len(s)
    return best


class RolloutEngine(abc.ABC):
    """Generates ``n_i`` completions for each prompt ``x_i`` (chapter 4, *The variance audit*).

    Subclasses implement :meth:`_generate`; :meth:`generate` checks the arguments first, so that every
    backend rejects bad input with the same ``ValueError``.
    """

    accepts_hook = False
    """whether :meth:`_generate` takes ``hook=`` (see :meth:`generate`)"""

    def generate(
        self,
        prompts: Sequence[Prompt],
        n: int | Sequence[int],
        params: SamplingParams,
        seed: int = 0,
        progress: bool = False,
        hook: Callable[[bool], None] | None = None,
    ) -> list[list[Completion]]:
        """Sample completions: ``result[i][j]`` is sample ``j`` of ``prompts[i]``.

        Args:
            prompts: rendered prompt texts or token-id sequences (an empty list gives ``[]``).
            n: rollouts per prompt: one integer for all prompts, or one per prompt (0 allowed).
            params: the :class:`SamplingParams`, applied exactly.
            seed: same inputs and seed give identical completions (on CPU); use a new seed for a new
                round of sampling on the same prompts, or the same samples come back.
            progress: show a tqdm progress bar.
            hook: for engines that generate step by step (``accepts_hook``, e.g. the transformers engine), called
                before each batch and between decode steps as ``hook(can_pause)``: whether another ``generate``
                call on this engine may run before this one goes on. An exception it raises stops the generation
                (the server's timeout, its cancellation on disconnect and its turns, chapter 4).
        """
        if hook is not None and not self.accepts_hook:
            raise ValueError(f"{type(self).__name__} generates in one call and takes no hook")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompts, counts = normalize_request(prompts, n)
        seed = check_seed(seed)
        if not prompts:
            return []
        if hook is not None:
            return self._generate(prompts, counts, params, seed, bool(progress), hook=hook)
        return self._generate(prompts, counts, params, seed, bool(progress))

    @abc.abstractmethod
    def _generate(
        self, prompts: list[Prompt], counts: list[int], params: SamplingParams, seed: int, progress: bool
    ) -> list[list[Completion]]:
        """Backend hook: arguments are already checked and normalised."""
