"""rho: the cost of training on one rollout relative to generating it (chapter 10's cost currencies).

The comparison of chapter 10 states results in generated rollouts and in
cost = generated + rho x trained rollouts. This benchmark measures rho for the tiny model on the
task and settings of the reference runs (``configs/tiny_uniform.yaml``: 16 prompts x 8 rollouts, up
to 48 new tokens, natural stopping), in one process, interleaved:

* generate: ``engine.generate`` of one step's 128 rollouts (the sampled completions, scored);
* train: one optimizer step of the trainer's policy (``LMPolicy.optimize``) on those 128 rollouts,
  every one with a non-zero advantage.

rho = median(train) / median(generate) per rollout, the median of the 30 paired ratios. Run it on an idle
machine; the result is written to ``data/bench/rho.json`` (2.79 on a two-core AMD EPYC with nothing else
running, 27 November; ``rho_repeat.json`` is a second run, 2.78; ``rho_declared.json`` the 15-pair
measurement of 24 November, 2.44, on another instance, which chapter 10's cost suite declared):

    .venv/bin/python bench/bench_rho.py --threads 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, interleaved, paired_ratio, summary, write_json  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "data" / "tiny" / "spread"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(DATA / "rho.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from rlcurate.curation.base import Group
    from rlcurate.models import load_policy
    from rlcurate.rollout import SamplingParams, TransformersEngine
    from rlcurate.tasks import get_task
    from rlcurate.train import TrainConfig
    from rlcurate.train.policy import LMPolicy

    config = TrainConfig.load(REPO / "configs" / "tiny_uniform.yaml")
    model, tok = load_policy(args.model, device="cpu")
    task = get_task(config.task, **config.task_kwargs)
    problems = task.problems("train")[: config.prompts_per_step]
    prompts = [task.render(p, tok) for p in problems]
    engine = TransformersEngine(model, tok, token_budget=config.gen_token_budget)
    sampling = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-12)  # a real step that leaves the model as it is
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    policy = LMPolicy(model, tok, engine, config, optimizer, scheduler)
    state = {"seed": 0}

    def generate():
        state["seed"] += 1
        state["out"] = engine.generate(prompts, config.group_size, sampling, seed=state["seed"])

    def train():
        groups = [Group(index=i, problem=p, prompt=pr, completions=list(c), rewards=np.zeros(len(c)))
                  for i, (p, pr, c) in enumerate(zip(problems, prompts, state["out"]))]
        advantages = [np.where(np.arange(g.size) % 2 == 0, 1.0, -1.0) for g in groups]  # every rollout trained
        policy.update(groups, advantages)

    t_gen, t_train = interleaved([generate, train], repeats=args.repeats, warmup=2)
    rollouts = len(prompts) * config.group_size
    rec = header("rho: training cost of a rollout relative to generating it", threads=args.threads)
    rec.update({"model": args.model, "rollouts_per_call": rollouts, "max_new_tokens": config.max_new_tokens,
                "generate": summary(t_gen), "train": summary(t_train),
                "rho": paired_ratio(t_train, t_gen)})
    path = write_json(rec, args.out)
    print(f"rho (train / generate per rollout): median of paired ratios {rec['rho']['median_paired_ratio']}, "
          f"ratio of medians {rec['rho']['ratio_of_medians']}; {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
