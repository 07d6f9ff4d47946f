"""What the final policies of the DRO suite write after their scratchpads (chapter 8).

    python data/runs/dro/answer_drift.py            # after: rlcurate runs --suite configs/suites/dro.yaml

For the `spread` start checkpoint and for every (run, seed) of configs/suites/dro.yaml whose scratch
checkpoint (runs/dro/<run>_s<seed>/checkpoint/state.pt, the policy after its 12,800 rollouts) exists,
sample 8 completions at temperature 1 for each held-out problem of the suites' task and sort them:

* correct: the answer after ``#`` is the gold answer;
* gold + extra: the answer starts with the gold answer and goes on (extra digits or symbols);
* other wrong: anything else, including no delimiter.

It also scores every scratchpad with R3 under the fixed `spread` policy (the reference answer
teacher-forced after the rollout's reasoning) and counts the wrong rollouts whose scratchpad makes
the gold answer likely (normalised R3 > 0.5): a right derivation followed by a wrong answer.
Writes data/runs/dro/answer_drift.json. Deterministic on CPU for a given seed.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from rlcurate.curation.base import StepContext
from rlcurate.curation.dro import DROProcessor
from rlcurate.models import load_policy
from rlcurate.rollout import SamplingParams, TransformersEngine
from rlcurate.tasks import get_task

REPO = Path(__file__).resolve().parents[3]
SUITE = "dro"
G = 8
SEED = 0


def classify(task, problem, text: str) -> str:
    answer = task.split(text)[1]
    if answer is None:
        return "other wrong"
    answer = answer.strip()
    if answer == problem.answer:
        return "correct"
    if answer.startswith(problem.answer):
        return "gold + extra"
    return "other wrong"


def main() -> int:
    torch.set_num_threads(1)
    task = get_task("arithmetic", n_train=256, n_test=32)
    problems = task.problems("test")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48)
    scorer, tok = load_policy(str(REPO / "data" / "tiny" / "spread"), device="cpu")
    proc = DROProcessor(use_as="none")
    policies = {"spread (start)": None}
    for res in sorted((REPO / "data" / "runs" / SUITE).glob("*_s*.json")):
        ckpt = REPO / "runs" / SUITE / res.stem / "checkpoint" / "state.pt"
        if ckpt.is_file():
            policies[res.stem] = ckpt
    out = {"command": "python data/runs/dro/answer_drift.py", "problems": len(problems), "group_size": G,
           "seed": SEED, "policies": {}}
    for name, ckpt in policies.items():
        t0 = time.perf_counter()
        model, _ = load_policy(str(REPO / "data" / "tiny" / "spread"), device="cpu")
        if ckpt is not None:
            model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["model"])
        model.eval()
        ctx = StepContext(step=0, seed=SEED, problems=problems, task=task, tokenizer=tok,
                          engine=TransformersEngine(model, tok), sampling=sampling, group_size=G,
                          prompts_per_step=len(problems), policy=scorer)  # R3 under the fixed spread policy
        groups = ctx.generate(list(range(len(problems))), G)
        stats = proc.statistics(ctx, groups)
        kinds = [classify(task, g.problem, c.text) for g in groups for c in g.completions]
        r3 = np.concatenate([s.r3_normalised for s in stats])
        wrong = np.array([k != "correct" for k in kinds])
        counts = {k: int(sum(x == k for x in kinds)) for k in ("correct", "gold + extra", "other wrong")}
        out["policies"][name] = {
            "rollouts": len(kinds), **counts,
            "wrong_with_right_scratchpad": int(np.sum(wrong & (r3 > 0.5))),
            "mean_completion_tokens": float(np.mean([len(c.token_ids) for g in groups for c in g.completions])),
            "examples": [c.text for g in groups for c in g.completions
                         if classify(task, g.problem, c.text) == "gold + extra"][:4],
            "seconds": time.perf_counter() - t0,
        }
        print(name, {k: v for k, v in out["policies"][name].items() if k != "examples"}, flush=True)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    except OSError:
        sha = None
    import transformers

    out["environment"] = {"git_sha": sha, "python": platform.python_version(), "torch": torch.__version__,
                          "transformers": transformers.__version__, "device": "cpu", "threads": 1}
    path = REPO / "data" / "runs" / SUITE / "answer_drift.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
