"""Integer arithmetic with graded difficulty: the task of the tiny world (chapter 4, *The variance
audit*), with reference solutions that serve as hints (chapter 7, SAGE) and as teacher-forced
reference answers (chapter 8, DRO).

A *level* fixes the operator and the number of digits of each operand, e.g. ``"add3"`` (three-digit
plus three-digit) or ``"mul2x1"`` (two-digit times one-digit). Problems are drawn deterministically
from a seed, and a hash of the operands (not the seed) decides whether a problem belongs to the
train or the test split, so the splits are disjoint by construction, for every seed at once.

Every problem carries its reference solution as a tuple of short steps, the scratchpad:

* addition, column by column from the right, with the carry: ``7+5+0=12``, ``4+8+1=13``;
* subtraction (``a >= b``), column by column with the borrow; a borrowed column is written with a
  leading 1: ``12-7-0=5``, ``5-4-1=0``;
* multiplication by a one-digit number, digit by digit with the carry: ``7*8+0=56``, ``4*8+5=37``;
* multiplication by a longer number, partial products then their running sum:
  ``47*8=376``, ``47*30=1410``, ``376+1410=1786``.

Two prompt styles:

``style="tiny"``
    the tiny model's own chat template: ``<|user|>47+85=<|assistant|>``. The completion is the
    scratchpad, one step per line, then the delimiter ``#`` and the final answer:
    ``7+5+0=12\\n4+8+1=13\\n#132`` (``scratchpad=True``), or only ``#132`` (``scratchpad=False``).
    Everything before ``#`` is reasoning, everything after it is the answer; :func:`split_completion`
    cuts there. A hint of level k (chapter 7) writes the first k steps at the start of the assistant
    turn, ``<|user|>47+85=<|assistant|>7+5+0=12\\n``, and the model writes the rest (partial-solution
    prefixing, ``hint_mode="prefix"``). SAGE's own hint (``hint_mode="user"``) is in the user turn and
    never states the answer: ``<|user|>hint:\\n7+5+0=12\\n47+85=<|assistant|>``, at most all steps but the
    last (:mod:`rlcurate.tasks.hints`).
``style="chat"``
    a real small instruct model (SmolLM2-135M-Instruct): three few-shot chat turns, the question
    ``What is 47 + 85?``, and an assistant prefill ``47 + 85 =``; the first integer of the
    completion is the answer.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from rlcurate.tasks.arithmetic_problems import OPS, Level, stable_seed, solve, split_of
from rlcurate.tasks.base import Problem, Reward, Task, check_hint_mode, render_chat
from rlcurate.tasks.hints import user_hint
ANSWER_DELIMITER = "#"
HINT_HEADER = "hint:"
EOS_TEXT = "<|endoftext|>"
HINT_LEVELS = (1, 2, 3)

# The default levels of the tiny world: a warm-started ~1M-parameter model sees pass rates from 0 to 1
# on them (data/tiny/*/README.md). One-digit levels are left out (they saturate at once); "mul2", whose
# partial products the scratchpad does not break down, stays hard for a long time.
TINY_LEVELS = ("add2", "add3", "add4", "sub2", "sub3", "sub4", "mul2x1", "mul3x1", "mul2")
# SmolLM2-135M-Instruct, few-shot with prefill: mixed pass rates on these (reference/smollm2.md).
CHAT_LEVELS = ("add1", "add2", "add3", "mul2x1", "mul2")

# The exact few-shot turns documented for SmolLM2 in reference/smollm2.md.
CHAT_FEW_SHOT = (
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "3 + 4 = 7"},
    {"role": "user", "content": "What is 25 + 17?"},
    {"role": "assistant", "content": "25 + 17 = 42"},
    {"role": "user", "content": "What is 12 * 3?"},
    {"role": "assistant", "content": "12 * 3 = 36"},
)

_INT_RE = re.compile(r"-?\d+(?:,\d{3})*")
# Enumerate a level's split exactly when it has at most this many operand pairs.
_ENUMERATE_LIMIT = 20_000


def strip_eos(text: str) -> str:
    """``text`` up to the first end-of-sequence marker (decoded completions may still carry it);
    used by the verifiers of chapter 4."""
    cut = text.find(EOS_TEXT)
    return text if cut < 0 else text[:cut]


def split_completion(text: str, delimiter: str = ANSWER_DELIMITER) -> tuple[str, str | None]:
    """Split a tiny-style completion into ``(reasoning, answer)`` at the first ``delimiter``
    (chapter 8: DRO keeps each rollout's reasoning and teacher-forces the reference answer after it).

    ``reasoning + delimiter + answer`` equals the completion up to its end-of-sequence marker; the
    answer is ``None`` when the delimiter is missing (the whole text is then reasoning). Never raises
    on a string.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    text = strip_eos(text)
    cut = text.find(delimiter)
    if cut < 0:
        return text, None
    return text[:cut], text[cut + len(delimiter):]


def first_integer(text: str) -> str | None:
    """The first integer in ``text`` as a canonical string (thousands separators removed), or None.
    The answer extractor of the chat style (chapter 4)."""
    m = _INT_RE.search(text)
    if m is None:
        return None
    return str(int(m.group(0).replace(",", "")))


# ----------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------


class ArithmeticTask(Task):
    """Arithmetic problems at several difficulty levels with an exact-match verifier (chapter 4).

    Args:
        levels: level specs (``"add3"``, ``"mul2x1"``, :class:`Level`); default :data:`TINY_LEVELS`
            for the tiny style and :data:`CHAT_LEVELS` for the chat style.
        style: ``"tiny"`` (the tiny model's template, scratchpad then ``#answer``) or ``"chat"``
            (few-shot chat turns and a prefill, for SmolLM2-135M-Instruct).
        scratchpad: tiny style only: whether the completion writes the reasoning steps before the
            answer (default True).
        n_train, n_test: problems per level in each split (fewer when a level has fewer problems).
            ``problems("validation")`` gives ``n_test`` more per level from the test side of the hash,
            none of them in the test split: for choosing a learning rate without the test prompts
            (chapter 10).
        test_fraction: the share of operand pairs hashed into the test split.
        seed: which problems are drawn; the split of any given problem does not depend on it.
        few_shot: chat style only: prepend the three documented few-shot turns (default True).
        hint_placement: where a hint goes (chapter 7). ``"assistant"`` (the default of the tiny style
            with scratchpad): the revealed steps start the assistant turn and the model writes the rest
            of the scratchpad. ``"user"`` (the default otherwise): the hint is part of the user turn
            and the model writes the whole completion. The tiny checkpoints ``early``, ``spread`` and
            ``saturated`` never saw a hint in the user turn and are thrown off by one; ``spread_user``
            was warm-started with SAGE's answer-free user-turn hints on half its prompts and uses them
            (data/tiny/README.md). A SAGE strategy's ``hint_mode`` overrides the placement per rendered
            prompt (:meth:`render`); ``hint_placement`` is what ``hint_mode=None`` (the strategies'
            ``"auto"``) uses, as before.
    """

    name = "arithmetic"

    def __init__(
        self,
        levels: Sequence | None = None,
        *,
        style: str = "tiny",
        scratchpad: bool | None = None,
        n_train: int = 256,
        n_test: int = 32,
        test_fraction: float = 0.2,
        seed: int = 0,
        few_shot: bool = True,
        hint_placement: str | None = None,
    ):
        if style not in ("tiny", "chat"):
            raise ValueError(f"style must be 'tiny' or 'chat', got {style!r}")
        if scratchpad is None:
            scratchpad = style == "tiny"
        if style == "chat" and scratchpad:
            raise ValueError("scratchpad=True needs style='tiny'; the chat style answers directly")
        if levels is None:
            levels = TINY_LEVELS if style == "tiny" else CHAT_LEVELS
        if isinstance(levels, (str, Level)):
            levels = [levels]
        self.levels = tuple(Level.parse(s) for s in levels)
        if not self.levels:
            raise ValueError(f"levels must not be empty, got {levels!r}")
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"levels must be distinct, got {names}")
        for arg, v in (("n_train", n_train), ("n_test", n_test)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{arg} must be a non-negative integer, got {v!r}")
        if not isinstance(test_fraction, (int, float)) or not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if hint_placement is None:
            hint_placement = "assistant" if style == "tiny" and scratchpad else "user"
        if hint_placement not in ("assistant", "user"):
            raise ValueError(f"hint_placement must be 'assistant' or 'user', got {hint_placement!r}")
        if hint_placement == "assistant" and not (style == "tiny" and scratchpad):
            raise ValueError("hint_placement='assistant' needs style='tiny' with scratchpad=True (the hint is "
                             "the start of the scratchpad)")
        self.hint_placement = hint_placement
        self.style = style
        self.scratchpad = bool(scratchpad)
        self.n_train, self.n_test = int(n_train), int(n_test)
        self.test_fraction = float(test_fraction)
        self.seed = int(seed)
        self.few_shot = bool(few_shot)
        self._cache: dict[str, list[Problem]] = {}

    def __repr__(self) -> str:
        return (
            f"ArithmeticTask(levels={[lv.name for lv in self.levels]}, style={self.style!r}, "
            f"scratchpad={self.scratchpad}, hint_placement={self.hint_placement!r}, n_train={self.n_train}, "
            f"n_test={self.n_test}, seed={self.seed})"
        )

    # -- problems --------------------------------------------------------------------------------

    def make_problem(self, op: str, a: int, b: int) -> Problem:
        """The :class:`Problem` ``a op b`` with uid ``"add:47+85"``, its answer, scratchpad steps as
        ``solution`` and ``meta`` = op, a, b, digits, level (chapter 4)."""
        steps, answer = solve(op, a, b)
        level = Level(op, len(str(a)), len(str(b)))
        sym = OPS[op]
        if self.style == "tiny":
            question = f"{a}{sym}{b}="
        else:
            question = f"What is {a} {sym} {b}?"
        meta = {"op": op, "a": int(a), "b": int(b), "digits": (level.digits_a, level.digits_b), "level": level.name}
        return Problem(uid=f"{op}:{a}{sym}{b}", question=question, answer=answer, solution=steps, meta=meta)

    def split_of(self, problem: Problem) -> str:
        """``"train"`` or ``"test"``: the hash split of ``problem`` (chapter 4)."""
        m = problem.meta
        return split_of(m["op"], m["a"], m["b"], self.test_fraction)

    def _draw_pair(self, level: Level, rng: np.random.Generator) -> tuple[int, int]:
        (la, ha), (lb, hb) = level.operand_range("a"), level.operand_range("b")
        a, b = int(rng.integers(la, ha + 1)), int(rng.integers(lb, hb + 1))
        if level.op == "sub" and a < b:
            a, b = b, a
        return a, b

    def _level_problems(self, level: Level, split: str, n: int) -> list[Problem]:
        if split == "validation":  # the test side of the hash, less the test split's own problems
            taken = {(p.meta["a"], p.meta["b"]) for p in self._level_problems(level, "test", self.n_test)}
            return self._level_draw(level, "test", n, stable_seed(self.seed, level.name, "validation"), taken)
        return self._level_draw(level, split, n, stable_seed(self.seed, level.name, split), set())

    def _level_draw(self, level: Level, split: str, n: int, entropy, exclude: set) -> list[Problem]:
        rng = np.random.default_rng(entropy)
        if level.size() <= _ENUMERATE_LIMIT:
            (la, ha), (lb, hb) = level.operand_range("a"), level.operand_range("b")
            pairs = [
                (a, b)
                for a in range(la, ha + 1)
                for b in range(lb, hb + 1)
                if not (level.op == "sub" and a < b) and split_of(level.op, a, b, self.test_fraction) == split
                and (a, b) not in exclude
            ]
            order = rng.permutation(len(pairs))[:n]
            return [self.make_problem(level.op, *pairs[i]) for i in order]
        seen: set[tuple[int, int]] = set(exclude)
        out = []
        while len(out) < n:
            a, b = self._draw_pair(level, rng)
            if (a, b) in seen or split_of(level.op, a, b, self.test_fraction) != split:
                continue
            seen.add((a, b))
            out.append(self.make_problem(level.op, a, b))
        return out

    def problems(self, split: str = "train") -> list[Problem]:
        """``n_train`` or ``n_test`` problems per level of ``split`` (fewer where a level has fewer), in a
        fixed order that depends only on ``seed``: round robin over the levels, so that the first k
        problems cover the levels evenly (chapter 4). ``"validation"``: ``n_test`` per level, disjoint
        from both (see the class docstring)."""
        if split not in ("train", "test", "validation"):
            raise ValueError(f"split must be 'train', 'test' or 'validation', got {split!r}")
        if split not in self._cache:
            n = self.n_train if split == "train" else self.n_test
            per_level = [self._level_problems(level, split, n) for level in self.levels]
            # round robin over the levels, so that every prefix (an evaluation's first k prompts) is balanced
            out = [lp[i] for i in range(max(map(len, per_level))) for lp in per_level if i < len(lp)]
            self._cache[split] = out
        return list(self._cache[split])

    def sample(self, rng: np.random.Generator, split: str = "train", level=None) -> Problem:
        """One fresh random problem of ``split`` (at ``level``, or at a uniformly drawn level of the
        task), for an endless stream of warm-start data (chapter 4). Deterministic given ``rng``."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if level is None:
            lv = self.levels[int(rng.integers(len(self.levels)))]
        else:
            lv = Level.parse(level)
        for _ in range(10_000):
            a, b = self._draw_pair(lv, rng)
            if split_of(lv.op, a, b, self.test_fraction) == split:
                return self.make_problem(lv.op, a, b)
        raise ValueError(f"level {lv.name!r} has no problems in split {split!r}")

    # -- prompts ---------------------------------------------------------------------------------

    @property
    def hint_modes(self) -> tuple[str, ...]:
        """The ``hint_mode`` values :meth:`render` takes (chapter 7): ``("prefix", "user")`` in the tiny
        style with a scratchpad, else ``("user",)``."""
        return ("prefix", "user") if self.style == "tiny" and self.scratchpad else ("user",)

    def hint(self, problem: Problem, level: int, mode: str = "prefix") -> str:
        """The training-time hint of hint level ``level`` (chapter 7); level 0 is no hint (empty string).

        ``mode="prefix"`` (the default, unchanged): the first ``level`` steps of the reference solution,
        ``problem.reveal(level)``, the whole scratchpad once ``level`` reaches the number of steps.
        ``mode="user"``: SAGE's rule, :func:`rlcurate.tasks.hints.user_hint`: the first ``min(level, k)``
        steps, k leaving out the last step and every step from the first one that states the answer
        on, so the hint never contains the answer."""
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or level < 0:
            raise ValueError(f"level must be a non-negative integer, got {level!r}")
        if mode == "prefix":
            return problem.reveal(int(level))
        if mode == "user":
            return user_hint(problem, int(level))
        raise ValueError(f"mode must be 'prefix' or 'user', got {mode!r}")

    def placed_hint(self, problem: Problem, level: int) -> str:
        """The hint of ``level`` that goes where ``hint_placement`` puts it (chapter 7, the warm-start's
        hinted prompts): the first ``level`` steps at the start of the assistant turn, SAGE's
        answer-free hint (``mode="user"``) in the user turn."""
        return self.hint(problem, level, mode="prefix" if self.hint_placement == "assistant" else "user")

    def _placement(self, hint_mode: str | None) -> str:
        """Where a hint goes for ``hint_mode`` (``None``: ``hint_placement``)."""
        check_hint_mode(self, hint_mode)
        if hint_mode is None:
            return self.hint_placement
        return "assistant" if hint_mode == "prefix" else "user"

    def messages(self, problem: Problem, hint: str | None = None, *,
                 placement: str | None = None) -> list[dict[str, str]]:
        """The chat turns that pose ``problem``. With ``hint_placement="user"`` (or ``placement="user"``)
        a non-empty ``hint`` (chapter 7) is part of the user turn: tiny style ``hint:\\n{steps}\\n47+85=``
        (hint first), chat style ``What is 47 + 85?\\nHint:\\n{steps}``. With ``"assistant"`` the user turn
        is the bare question and the hint goes into :meth:`prefill`."""
        _check_hint(hint)
        placement = self.hint_placement if placement is None else placement
        m = problem.meta
        sym = OPS[m["op"]]
        if self.style == "tiny":
            content = f"{m['a']}{sym}{m['b']}="
            # Before the question: the tiny model finds operand digits by their distance from the
            # position it writes, and a hint between question and answer would shift them.
            if hint and placement == "user":
                content = f"{HINT_HEADER}\n{hint}\n{content}"
            return [{"role": "user", "content": content}]
        content = f"What is {m['a']} {sym} {m['b']}?"
        if hint:
            content += f"\nHint:\n{hint}"
        turns = [dict(t) for t in CHAT_FEW_SHOT] if self.few_shot else []
        return turns + [{"role": "user", "content": content}]

    def prefill(self, problem: Problem, hint: str | None = None, *, placement: str | None = None) -> str:
        """The text the assistant turn starts with: ``"47 + 85 ="`` in the chat style; in the tiny style
        the hint's steps, one per line (``"7+5+0=12\\n"``) when ``hint_placement="assistant"`` (or
        ``placement="assistant"``), else nothing (chapters 4 and 7)."""
        _check_hint(hint)
        placement = self.hint_placement if placement is None else placement
        if self.style == "tiny":
            if hint and placement == "assistant":
                return hint + "\n"
            return ""
        m = problem.meta
        return f"{m['a']} {OPS[m['op']]} {m['b']} ="

    def render(self, problem: Problem, tokenizer, hint: str | None = None, hint_mode: str | None = None) -> str:
        """The exact text a model is conditioned on: the chat template of :meth:`messages`, then
        :meth:`prefill` (which carries an assistant-side hint, chapter 7). ``hint_mode``: ``None`` puts a
        hint where ``hint_placement`` says (as before), ``"prefix"`` at the start of the assistant turn
        (tiny style with scratchpad only), ``"user"`` in the user turn; any other value is a
        ``ValueError``. (The mode places the text; :meth:`hint` with ``mode`` chooses it.)"""
        placement = self._placement(hint_mode)
        return render_chat(tokenizer, self.messages(problem, hint, placement=placement),
                           self.prefill(problem, hint, placement=placement))

    def target(self, problem: Problem) -> str:
        """The reference completion (without end-of-sequence): the supervised warm-start target
        (chapter 4). Tiny style: scratchpad lines then ``#answer``; chat style: ``" answer"``."""
        if self.style == "chat":
            return " " + problem.answer
        reasoning = "".join(step + "\n" for step in problem.solution) if self.scratchpad else ""
        return reasoning + self.format_answer(problem.answer)

    def max_completion_chars(self) -> int:
        """An upper bound on the characters of any reference completion of the task's levels (without
        eos). With the tiny tokenizer (one token per character) ``max_new_tokens`` must be at least
        this plus one for eos (chapter 4)."""
        longest = 0
        for lv in self.levels:
            da, db = lv.digits_a, lv.digits_b
            n_answer = da + db if lv.op == "mul" else max(da, db) + (lv.op == "add")
            if self.style == "chat":
                longest = max(longest, 1 + n_answer)
                continue
            if not self.scratchpad:
                steps = 0
            elif lv.op in ("add", "sub"):
                steps = 9 * max(da, db)  # "7+5+1=13\n", "12-7-1=4\n"
            elif db == 1:
                steps = 9 * da  # "7*8+5=61\n"
            else:  # partial products "47*30=1410\n", then running sums "376+1410=1786\n"
                steps = db * (2 * (da + db) + 3) + (db - 1) * (3 * (da + db) + 3)
            longest = max(longest, steps + 1 + n_answer)
        return longest

    def format_answer(self, answer: str) -> str:
        """The text that states ``answer`` after the reasoning: ``"#132"`` (tiny) or ``" 132"``
        (chat). DRO (chapter 8) appends it to each rollout's reasoning and scores it teacher-forced."""
        if not isinstance(answer, str):
            raise ValueError(f"answer must be a string, got {answer!r}")
        return (ANSWER_DELIMITER if self.style == "tiny" else " ") + answer

    def split(self, completion: str) -> tuple[str, str | None]:
        """``(reasoning, answer)`` of a completion (chapter 8). Tiny style: :func:`split_completion`.
        Chat style: the reasoning is empty and the answer is the first integer (None if there is none)."""
        if self.style == "tiny":
            return split_completion(completion)
        if not isinstance(completion, str):
            raise ValueError(f"completion must be a string, got {type(completion).__name__}")
        return "", first_integer(strip_eos(completion))

    def _score(self, problem: Problem, completion: str) -> Reward:
        _, answer = self.split(completion)
        if answer is None:
            what = f"delimiter {ANSWER_DELIMITER!r}" if self.style == "tiny" else "integer"
            return Reward(0.0, f"no {what} in the completion")
        answer = answer.strip()
        if answer == problem.answer:
            return Reward(1.0, "exact match")
        return Reward(0.0, f"answer {answer[:20]!r} != {problem.answer!r}")


def _check_hint(hint) -> None:
    if hint is not None and not isinstance(hint, str):
        raise ValueError(f"hint must be a string or None, got {hint!r}")


def levels_of(problems: Iterable[Problem]) -> list[str]:
    """The distinct ``meta["level"]`` values of ``problems`` in order of first appearance, for the
    per-level tables of chapter 4."""
    out: list[str] = []
    for p in problems:
        name = p.meta.get("level")
        if name not in out:
            out.append(name)
    return out
