"""Train SmolLM2-135M-Instruct a few steps with TRL's own GRPOTrainer and INSIGHT + DAPO (appendix A2, issue #32).

The prompts are chapter 10's SmolLM2 task (two-digit sums, differences and products in SmolLM2's few-shot chat
turns, appendix A3), the reward this package's verifier. ``CuratedGRPOTrainer`` is TRL's ``GRPOTrainer`` with
INSIGHT choosing each generation batch and DAPO's dynamic sampling drawing more prompts until B groups are mixed;
everything else (generation, scoring, the loss, logging) is TRL's. Runs on a CPU in a few minutes::

    .venv/bin/python scripts/trl_insight_dapo.py --steps 4

It prints TRL's log lines (with the strategy's own ``curation/*`` metrics) and writes them, the time and the
versions to ``data/interop/trl_insight_dapo.json``. On a GPU box, pass ``--model`` a Hub id and drop ``use_cpu``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder or Hub id (default: SmolLM2's local export)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4, help="B: prompts (groups) per step")
    ap.add_argument("--group", type=int, default=4, help="num_generations")
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--out", default=str(REPO / "data" / "interop" / "trl_insight_dapo.json"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from rlcurate.interop.trl import CuratedGRPOTrainer
    from rlcurate.tasks import get_task

    if args.model is None:
        from rlcurate.models.hf import load_smollm2, smollm2_cache_dir

        load_smollm2()  # exports the plain checkpoint once
        args.model = str(smollm2_cache_dir())
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    task = get_task("arithmetic", style="chat", levels=["add2", "sub2", "mul2x1"], n_train=24, n_test=8, seed=0)
    problems = task.problems("train")
    by_uid = {p.uid: p for p in problems}
    ds = Dataset.from_dict({"prompt": [task.render(p, tok) for p in problems], "uid": [p.uid for p in problems]})

    def correct(prompts, completions, uid, **kwargs):
        return [task.reward(by_uid[u], c).value for u, c in zip(uid, completions)]

    cfg = GRPOConfig(output_dir=str(REPO / "runs" / "trl_insight_dapo"), per_device_train_batch_size=args.prompts * args.group,
                     num_generations=args.group, max_completion_length=args.new_tokens, learning_rate=1e-5,
                     max_steps=args.steps, beta=0.0, loss_type="dapo", scale_rewards="group", temperature=1.0,
                     top_k=0, top_p=1.0, use_cpu=True, bf16=False, fp16=False, use_vllm=False, report_to="none",
                     save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, gradient_checkpointing=False)
    trainer = CuratedGRPOTrainer(model=args.model, reward_funcs=correct, args=cfg, train_dataset=ds,
                                 processing_class=tok, strategy="insight+dapo",
                                 strategy_kwargs={"max_num_gen_batches": 4})
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    logs = [{k: v for k, v in h.items()} for h in trainer.state.log_history if "loss" in h]
    keep = ("step", "loss", "reward", "frac_reward_zero_std", "curation/dapo_gen_batches", "curation/dapo_mixed",
            "curation/generation_calls", "curation/filled_groups", "curation/prompts_observed",
            "curation/belief_mean_observed")
    print(f"{'step':>4} {'reward':>7} {'zero-std':>8} {'gen batches':>11} {'mixed':>6} {'filled':>6} {'observed':>8}")
    for h in logs:
        print(f"{h['step']:>4} {h['reward']:>7.3f} {h['frac_reward_zero_std']:>8.2f} "
              f"{h.get('curation/dapo_gen_batches', float('nan')):>11.0f} {h.get('curation/dapo_mixed', float('nan')):>6.0f} "
              f"{h.get('curation/filled_groups', float('nan')):>6.0f} {h.get('curation/prompts_observed', float('nan')):>8.0f}")
    print(f"{args.steps} steps in {seconds:.0f} s on {torch.get_num_threads()} CPU thread(s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "what": "TRL GRPOTrainer + rlcurate INSIGHT + DAPO on SmolLM2-135M-Instruct (scripts/trl_insight_dapo.py)",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "config": {"steps": args.steps, "prompts": args.prompts, "group": args.group, "new_tokens": args.new_tokens,
                   "strategy": "insight+dapo", "max_num_gen_batches": 4},
        "seconds": round(seconds, 1), "threads": torch.get_num_threads(),
        "log": [{k: h[k] for k in keep if k in h} for h in logs],
        "steps": trainer.step_log}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
