"""SAGE's hint modes (issue #16, chapter 7): ``hint_mode="user"`` (SAGE's rule: a hint in the user turn
that never states the final answer) against ``"prefix"`` (partial-solution prefixing: the first
reference steps start the assistant turn), and the default ``"auto"``, which must render exactly what
earlier versions rendered so that the committed reference runs stay valid."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rlcurate.curation import build_curator
from rlcurate.curation.base import StepContext
from rlcurate.curation.sage import HintSource, SageLightSampler, SageSampler, fallback_hints
from rlcurate.errors import UserError
from rlcurate.rollout.base import Completion, RolloutEngine, SamplingParams
from rlcurate.tasks.arithmetic import ArithmeticTask
from rlcurate.tasks.base import Problem
from rlcurate.tasks.gsm8k import parse_gsm8k_solution
from rlcurate.tasks.hints import answer_free_steps, cut_at_answer, states_answer, user_hint
from rlcurate.train.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
LEVELS = range(0, 7)  # 0 (no hint), SAGE's 1..3, and levels past every problem's number of steps


@pytest.fixture(scope="module")
def tok():
    from rlcurate.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def pool():
    """The prompt pool of the tiny reference runs (configs/tiny_uniform.yaml), its whole train split."""
    task = ArithmeticTask(**TrainConfig.load(REPO / "configs" / "tiny_uniform.yaml").task_kwargs)
    return task, task.problems("train")


# ------------------------------------------------------------------------------ the never-reveal rule
def test_no_user_hint_states_the_answer_over_the_whole_arithmetic_train_split(pool):
    task, problems = pool
    assert len(problems) == 2304
    shown = set()
    for p in problems:
        steps, n = p.solution, len(p.solution)
        k = answer_free_steps(p)
        # the cut rule: never the last step; stop just before the first step that states the answer
        assert 0 <= k <= n - 1
        assert not any(p.answer in s for s in steps[:k])
        assert k == n - 1 or p.answer in steps[k]
        for lv in LEVELS:
            hint = task.hint(p, lv, mode="user")
            assert p.answer not in hint, (p.uid, lv, hint)
            assert hint == user_hint(p, lv) == "\n".join(steps[:min(lv, k)])
            assert hint.count("\n") + bool(hint) < n  # never the whole scratchpad
        shown.add(k)
    assert shown == {0, 1, 2, 3}
    # the contrast is not vacuous: the prefix hint gives the answer away, literally or in full
    full = [p for p in problems if task.hint(p, 3) == "\n".join(p.solution)]
    assert any(p.answer in task.hint(p, 3) for p in problems)
    assert len(full) / len(problems) > 0.5


def test_levels_are_monotone(pool):
    task, problems = pool
    for p in problems:
        for mode in ("user", "prefix"):
            hints = [task.hint(p, lv, mode=mode) for lv in LEVELS]
            for lo, hi in zip(hints, hints[1:]):  # a higher level shows everything a lower one shows
                assert hi.startswith(lo) and len(hi) >= len(lo)
        # and the user hint never shows more than the prefix hint of the same level
        assert all(task.hint(p, lv, mode="prefix").startswith(task.hint(p, lv, mode="user")) for lv in LEVELS)


def test_states_answer_and_cut_at_answer():
    assert states_answer("15 apples", "5") and states_answer("she pays $1,800.", "1800")
    assert not states_answer("18", "") and not states_answer("one half", "\\frac{1}{2}")
    text = "Find the cost of one box first. Then multiply: that gives 18 dollars. Add the tip."
    assert cut_at_answer(text, "18") == "Find the cost of one box first."
    assert cut_at_answer("Line one\nThe total is 1,800\nmore", "1800") == "Line one"
    assert cut_at_answer("The answer is 18.", "18") == ""
    assert cut_at_answer("  Think about rates.  ", "18") == "Think about rates."
    for t in (text, "a 18 b", "x. 18", "1,8,0,0 and 1800"):
        for a in ("18", "1800", "8"):
            assert not states_answer(cut_at_answer(t, a), a)


# ------------------------------------------------------------------------------ where the hint goes
def _turns(task, p, hint, mode):
    placement = {"user": "user", "prefix": "assistant"}[mode]
    return task.messages(p, hint, placement=placement)[-1]["content"], task.prefill(p, hint, placement=placement)


@pytest.mark.parametrize("style", ["tiny", "chat"])
def test_user_hint_is_in_the_user_turn_and_not_in_the_assistant_prefix(tok, style):
    task = ArithmeticTask(["add3", "sub4", "mul2"], style=style, n_train=8, n_test=2)
    for p in task.problems("train"):
        hint = task.hint(p, 2, mode="user")
        assert hint
        user, prefill = _turns(task, p, hint, "user")
        assert hint in user and hint not in prefill
        assert prefill == task.prefill(p)  # the assistant turn starts as it does without a hint
        text = task.render(p, tok, hint=hint, hint_mode="user")
        head, _, tail = text.rpartition("<|assistant|>")
        assert hint in head and hint not in tail and tail == task.prefill(p)
        assert p.answer not in hint
        if style == "tiny":  # the prefix contrast: the same steps, at the start of the assistant turn
            user, prefill = _turns(task, p, hint, "prefix")
            assert hint not in user and prefill == hint + "\n"
            assert task.render(p, tok, hint=hint, hint_mode="prefix").endswith("<|assistant|>" + hint + "\n")


# Rendered prompts of every train problem at hint levels 0-3 (task.hint(p, level)), sha256 over the texts
# each followed by a NUL, computed with the code before hint_mode existed (git HEAD of issue #16). The
# committed tiny runs were made with these prompts: the default and 'prefix' must keep them bit for bit.
BEFORE = {
    "tiny": "25bf5654eaa9c107b41c35ec8e20e0e1281595926581e8814f32959b32ddbade",
    "tiny_user_placement": "43702032a4a86f76d864226db9d5b44bd15451a239c3aecc854817b036f4c6bb",
    "chat": "86e5ad3fbaff632673e6fd75d5adf11b5685e1d700aae2e80cdc050e9c9984e3",
}


def _digest(task, tok, **kw) -> str:
    h = hashlib.sha256()
    for p in task.problems("train"):
        for lv in range(4):
            h.update(task.render(p, tok, hint=task.hint(p, lv) or None, **kw).encode())
            h.update(b"\0")
    return h.hexdigest()


def test_prefix_mode_renders_bit_identical_prompts(tok):
    tiny = ArithmeticTask(n_train=64, n_test=8)
    assert _digest(tiny, tok) == BEFORE["tiny"]                      # hint_mode None: the task's placement
    assert _digest(tiny, tok, hint_mode="prefix") == BEFORE["tiny"]  # 'prefix' names exactly that
    user_placed = ArithmeticTask(n_train=64, n_test=8, hint_placement="user")
    assert _digest(user_placed, tok) == BEFORE["tiny_user_placement"]
    assert _digest(user_placed, tok, hint_mode="prefix") == BEFORE["tiny"]
    assert _digest(ArithmeticTask(style="chat", n_train=64, n_test=8), tok) == BEFORE["chat"]
    assert all(tiny.hint(p, lv) == tiny.hint(p, lv, mode="prefix") == p.reveal(lv)
               for p in tiny.problems("train") for lv in LEVELS)


# ------------------------------------------------------------------------------ the samplers
class WrongEngine(RolloutEngine):
    """Every rollout wrong ("#0"), so that SAGE climbs every collapsed prompt to level 3; records prompts."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def _generate(self, prompts, counts, params, seed, progress):
        self.calls.append(list(prompts))
        return [[Completion(k, j, [], [1, 2], "#0", [0.0, 0.0], "stop") for j in range(c)]
                for k, c in enumerate(counts)]


def _ctx(task, tok, engine, step=0):
    problems = task.problems("train")
    return StepContext(step=step, seed=0, problems=problems, task=task, tokenizer=tok, engine=engine,
                       sampling=SamplingParams(max_new_tokens=4), group_size=2, prompts_per_step=len(problems))


def test_sage_user_mode_poses_the_safe_hint_in_the_user_turn(tok):
    task = ArithmeticTask(["add3", "mul2"], n_train=4, n_test=2)
    engine = WrongEngine()
    groups = SageSampler(hint_mode="user").rollout(_ctx(task, tok, engine), list(range(8)))
    assert len(engine.calls) == 4  # level 0, then 1, 2, 3 for every prompt (all stay wrong)
    for g in groups:
        p, hint = g.problem, task.hint(g.problem, 3, mode="user")
        assert g.hint_level == 3 and g.prompt == task.render(p, tok, hint=hint, hint_mode="user")
        assert g.prompt.endswith("<|assistant|>") and f"hint:\n{hint}\n" in g.prompt and p.answer not in hint
    # the level-2 and level-3 hints of a three-step problem are the same two steps, never the third
    mul = [g for g in groups if g.problem.meta["op"] == "mul"]
    assert all(task.hint(g.problem, 2, mode="user") == task.hint(g.problem, 3, mode="user") for g in mul)


@pytest.mark.parametrize("regenerate", ["collapsed", "all"])
def test_sage_prefix_mode_samples_what_the_default_samples(tok, regenerate):
    task = ArithmeticTask(["add3", "mul2"], n_train=4, n_test=2)
    runs = {}
    for mode in ("auto", "prefix"):
        engine = WrongEngine()
        groups = SageSampler(regenerate=regenerate, hint_mode=mode).rollout(_ctx(task, tok, engine), list(range(8)))
        runs[mode] = (engine.calls, [(g.prompt, g.hint_level) for g in groups])
        # the hint of level l is the first l reference steps, at the start of the assistant turn
        assert all(g.hint_level == 3 and g.prompt.endswith("<|assistant|>" + g.problem.reveal(3) + "\n")
                   for g in groups)
    assert runs["auto"] == runs["prefix"]


def test_the_trainer_scores_the_user_turn_hinted_prompt(tmp_path):
    from rlcurate.models.tiny import build_tiny_model, build_tiny_tokenizer
    from rlcurate.train import Trainer

    cfg = TrainConfig(strategy="sage", strategy_kwargs={"hint_mode": "user"}, steps=1, prompts_per_step=4,
                      group_size=4, max_new_tokens=24, eval_every=0, out_dir=str(tmp_path), progress=False,
                      save_model=False, threads=1)
    task = ArithmeticTask(levels=["add3", "mul2"], n_train=32, n_test=4)
    tr = Trainer(cfg, model=build_tiny_model(seed=0), tokenizer=build_tiny_tokenizer(), task=task)
    seen = []
    rollout = tr.curator.sampler.rollout
    tr.curator.sampler.rollout = lambda ctx, idx: seen.append(rollout(ctx, idx)) or seen[-1]
    tr.run()
    hinted = [g for g in seen[0] if g.hint_level]
    assert hinted, "an untrained model fails every prompt: each one is hinted"
    for g in hinted:
        hint = task.hint(g.problem, g.hint_level, mode="user")
        assert g.prompt == task.render(g.problem, tr.tokenizer, hint=hint, hint_mode="user")
        assert g.prompt.endswith("<|assistant|>") and g.problem.answer not in hint
        assert g.completions[0].prompt_token_ids == tr.engine.encode([g.prompt])[0]  # log pi(y | x, h)


def test_sage_light_user_mode(tok):
    task = ArithmeticTask(["add3"], n_train=4, n_test=2)
    sampler = SageLightSampler(hint_mode="user")
    sampler.last_acc = {i: 0.0 for i in range(4)}
    sampler.last_level = {i: 1 for i in range(4)}  # next visit: level 2
    groups = sampler.rollout(_ctx(task, tok, WrongEngine()), list(range(4)))
    for g in groups:
        hint = task.hint(g.problem, 2, mode="user")
        assert g.hint_level == 2 and g.prompt == task.render(g.problem, tok, hint=hint, hint_mode="user")
    assert sampler.metrics() == {"sage_rolled_level0": 0, "sage_rolled_level1": 0, "sage_rolled_level2": 4,
                                 "sage_rolled_level3": 0, "sage_hint_levels_cut": 0}
    assert SageLightSampler().metrics() == {}  # before its first step


class HintWriter(RolloutEngine):
    """Answers SAGE's hint prompt with a JSON payload whose level 3 states the answer; records requests."""

    def __init__(self, payload):
        self.payload = payload
        self.requests: list[str] = []

    def _generate(self, prompts, counts, params, seed, progress):
        self.requests.extend(prompts)
        return [[Completion(k, j, [], [1] * 4, self.payload, [0.0] * 4, "stop") for j in range(c)]
                for k, c in enumerate(counts)]


GSM8K_ROW = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
             "How many clips did Natalia sell altogether in April and May?",
             "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
             "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


class SolutionTask(ArithmeticTask):
    """One GSM8K-style problem with a worked solution and no task hints (so the policy writes them)."""

    hint = None

    def problems(self, split="train"):
        steps, gold = parse_gsm8k_solution(GSM8K_ROW[1])
        return [Problem(uid="gsm8k/train/0", question=GSM8K_ROW[0], answer=gold, solution=steps,
                        meta={"op": "add", "a": 48, "b": 24})]


def test_self_hints_in_user_mode_are_solution_conditioned_and_cut_before_the_answer(tok):
    payload = json.dumps({"level_1": "Work out May first.", "level_2": "May is half of April: 24 clips.",
                          "level_3": "Add 48 and 24. The total is 72 clips."})
    task = SolutionTask(["add2"], style="chat", n_train=1, n_test=1)
    p = task.problems()[0]
    for mode, expect in [("user", {1: "Work out May first.", 2: "May is half of April: 24 clips.",
                                   3: "Add 48 and 24."}),
                         ("auto", json.loads(payload, object_hook=lambda d: {int(k[-1]): v for k, v in d.items()}))]:
        engine = HintWriter(payload)
        src = HintSource("self", mode=mode)
        hints = src.hints(_ctx(task, tok, engine), [0])[0]
        assert hints == expect
        assert p.solution[0] in engine.requests[0] and p.solution[1] in engine.requests[0]  # conditioned on the steps
        assert src.cut == (1 if mode == "user" else 0)
    assert all(p.answer not in h for h in fallback_hints(p, never_reveal=True).values())
    assert fallback_hints(p, never_reveal=True) == {1: p.solution[0], 2: p.solution[0], 3: p.solution[0]}
    assert "72" in fallback_hints(p)[3]  # the old fallback shows the whole two-step solution


def test_gsm8k_has_solutions_and_no_user_hint_states_its_answer(shared_data):
    from rlcurate.tasks.gsm8k import GSM8K
    from rlcurate.tasks.math import MATHLevel3to5

    problems = GSM8K(shared_data).problems("train")
    assert len(problems) == 7473 and all(p.solution for p in problems)  # SAGE's hints can be solution-conditioned
    for p in problems:
        for lv in range(1, 4):
            assert not states_answer(user_hint(p, lv), p.answer)
        assert not any(states_answer(h, p.answer) for h in fallback_hints(p, never_reveal=True).values())
    # why configs/gpu_sage_qwen25_05b_math.yaml cannot condition on a solution: its training file has none
    assert not any(p.solution for p in MATHLevel3to5(shared_data).problems("train"))


# ------------------------------------------------------------------------------ options and bad values
@pytest.mark.parametrize("bad", ["users", "Prefix", "assistant", "", None, 3])
def test_bad_hint_modes_give_one_clear_value_error(bad):
    for make in (lambda: SageSampler(hint_mode=bad), lambda: SageLightSampler(hint_mode=bad),
                 lambda: HintSource(mode=bad)):
        with pytest.raises(ValueError, match=r"^hint_mode must be 'auto', 'prefix' \(.*\) or 'user' \(.*\), got ") as e:
            make()
        assert e.value.__cause__ is None and "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"strategy 'sage', strategy_kwargs .*hint_mode must be 'auto'"):
        build_curator("sage", hint_mode=bad)
    task = ArithmeticTask(["add2"], n_train=2, n_test=1)
    p = task.problems()[0]
    if bad is not None:
        with pytest.raises(ValueError, match=r"^hint_mode must be 'prefix' or 'user' \(or None"):
            task.render(p, None, hint="x", hint_mode=bad)
        with pytest.raises(ValueError, match=r"^mode must be 'prefix' or 'user', got "):
            task.hint(p, 1, mode=bad)


def test_modes_a_task_cannot_place_are_refused_with_one_value_error(tok):
    with pytest.raises(ValueError, match=r"hint_mode='prefix' needs the task's hints"):
        SageSampler(hint_source="self", hint_mode="prefix")
    chat = ArithmeticTask(["add2"], style="chat", n_train=2, n_test=1)
    assert chat.hint_modes == ("user",) and ArithmeticTask(["add2"]).hint_modes == ("prefix", "user")
    sampler = SageSampler(hint_mode="prefix")
    with pytest.raises(ValueError, match=r"task 'arithmetic' takes hint_mode 'auto' or 'user'; 'prefix'"):
        sampler.check_task(chat)
    with pytest.raises(ValueError, match=r"task 'arithmetic' takes hint_mode 'auto' or 'user'; 'prefix'"):
        sampler.rollout(_ctx(chat, tok, WrongEngine()), [0])
    with pytest.raises(ValueError, match=r"task 'arithmetic' takes hint_mode 'user'"):
        chat.render(chat.problems()[0], tok, hint="x", hint_mode="prefix")
    with pytest.raises(ValueError, match=r"task 'arithmetic' has no hint\(\) method"):
        sampler.check_task(SolutionTask(["add2"], n_train=1, n_test=1))
    SageSampler(hint_mode="user").check_task(chat)  # fine: every task takes the user turn
    SageSampler().check_task(chat)                  # 'auto' with the task's own hint()
    SageSampler().check_task(SolutionTask(["add2"], n_train=1, n_test=1))  # 'auto': the policy writes them
    with pytest.raises(ValueError, match=r"hint_source='task' with hint_mode='auto' asks task 'arithmetic' for its "
                                         r"hint\(\), which it does not have; use hint_mode='user'"):
        SageSampler(hint_source="task").check_task(SolutionTask(["add2"], n_train=1, n_test=1))


def test_another_trainer_writes_only_the_tasks_own_hints_and_in_the_user_turn_where_it_renders_the_chat():
    """rlcurate.interop._core.check_task_hints, the one rule TRL, verl 0.7's rollout wrapper and verl 0.9's
    trainer apply (appendix A2)."""
    from rlcurate.interop._core import check_task_hints

    tiny, chat = ArithmeticTask(["add2"], n_train=2, n_test=1), ArithmeticTask(["add2"], style="chat", n_train=2, n_test=1)
    for source, mode in [("auto", "auto"), ("task", "user"), ("auto", "user")]:
        for chat_turns in (True, False):
            check_task_hints(HintSource(source, mode=mode), chat, "here", chat_turns=chat_turns)
    check_task_hints(HintSource("task", mode="prefix"), tiny, "TRL", chat_turns=False)  # TRL renders the text itself
    with pytest.raises(ValueError, match=r"^verl: hint_mode 'prefix' writes into the assistant turn, which this "
                                         r"trainer's chat template writes itself; only 'user' \(SAGE's own\)"):
        check_task_hints(HintSource("task", mode="prefix"), tiny, "verl", chat_turns=True)
    with pytest.raises(ValueError, match=r"^verl: task 'arithmetic' has no hint\(\) method, so hint_source 'auto' "
                                         r"means hints the policy writes itself, which need this package's trainer; "
                                         r"with hint_source: task"):
        check_task_hints(HintSource("auto", mode="user"), SolutionTask(["add2"], n_train=1, n_test=1), "verl",
                         chat_turns=True)
    with pytest.raises(ValueError, match=r"^TRL: hint_source 'self' means hints the policy writes itself"):
        check_task_hints(HintSource("self", mode="user"), chat, "TRL", chat_turns=False)
    with pytest.raises(ValueError, match=r"^TRL: .*task 'arithmetic' takes hint_mode 'auto' or 'user'; 'prefix'"):
        check_task_hints(HintSource("task", mode="prefix"), chat, "TRL", chat_turns=False)  # the task's own rule


def test_hint_mode_is_a_strategy_option_listed_by_rlcurate_strategies(capsys):
    from rlcurate.cli import main
    from rlcurate.curation.registry import options

    assert options("sage")["hint_mode"] == "auto" and options("sage_light")["hint_mode"] == "auto"
    assert main(["strategies", "sage"]) == 0
    out = capsys.readouterr().out
    assert "hint_mode = 'auto'" in out and "never the" in out and '"prefix"' in out
    assert build_curator("insight+sage_light", hint_mode="user").sampler.hint_mode == "user"


def test_gpu_sage_configs_use_the_user_mode():
    for name in ("gpu_sage_qwen25_05b_math.yaml", "gpu_sage_qwen25_05b_gsm8k.yaml"):
        cfg = TrainConfig.load(REPO / "configs" / name)
        assert cfg.strategy == "sage" and cfg.strategy_kwargs["hint_source"] == "self"
        assert cfg.strategy_kwargs["hint_mode"] == "user"
        assert build_curator(cfg.strategy, **cfg.strategy_kwargs).sampler.hints.mode == "user"
    assert TrainConfig.load(REPO / "configs" / "gpu_sage_qwen25_05b_gsm8k.yaml").task == "gsm8k"
    import yaml

    hinted = 0
    for path in sorted((REPO / "configs" / "suites").glob("gpu_*.yaml")):  # every hinting arm of a GPU suite
        suite = yaml.safe_load(path.read_text())
        for run, over in suite["runs"].items():
            if "sage" in str(over.get("strategy", "")):
                assert over["strategy_kwargs"]["hint_mode"] == "user", (path.name, run)
                hinted += 1
    assert hinted >= 2
    # the tiny reference suites keep the default, so their committed runs stay what they were
    tiny = yaml.safe_load((REPO / "configs" / "suites" / "end_to_end.yaml").read_text())
    assert "strategy_kwargs" not in tiny["runs"]["sage"] and "strategy_kwargs" not in tiny["runs"]["sage_light"]
