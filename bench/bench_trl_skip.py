"""What ``skip_zero_advantage`` saves TRL's training passes (``rlcurate.interop.trl_skip``, appendix A2).

TRL 1.16's ``GRPOTrainer`` trains ``--steps`` generation batches of ``--prompts`` prompts x ``--group`` completions
on the arithmetic task, scored exactly (default checkpoint ``data/tiny/spread``, the book's trained tiny model, whose
groups are often all right or all wrong), each split into ``--micro`` micro-batches; every generation batch TRL
trains is recorded. Then, in one process, each recorded generation batch's training passes (TRL's own
``_compute_loss``, forward and backward, on every micro-batch: what one optimizer step's gradient costs) are timed
dense and packed by :func:`rlcurate.interop.trl_skip.pack`, the two in turn within each round (same machine load),
``--repeats`` rounds. Reported: the share of rows and of padded positions the packing removes, the gradient's
largest difference (it must be float32 rounding), and the paired time ratio packed / dense per generation batch and
over all of them (median of per-round ratios of the summed times). Currency: wall time of the training passes on
one thread, not the step (generation is unchanged), on an idle machine.

    .venv/bin/python bench/bench_trl_skip.py --steps 6 --out data/bench/trl_skip.json
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, paired_ratio, summary, write_json  # noqa: E402
from bench_trl_step import checkpoint_dir, checkpoint_label, make_task  # noqa: E402


def record_generation_batches(ckpt: Path, task, args, out: Path) -> tuple[object, list[list[dict]]]:
    """Train TRL's GRPOTrainer ``args.steps`` steps densely; return it and every generation batch's micro-batches."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(ckpt)
    problems = task.problems("train")
    by_uid = {p.uid: p for p in problems}
    ds = Dataset.from_dict({"prompt": [task.render(p, tok) for p in problems], "uid": [p.uid for p in problems]})

    def reward(prompts, completions, uid, **kwargs):
        return [task.reward(by_uid[u], c).value for u, c in zip(uid, completions)]

    recorded: list[list[dict]] = []

    class Recording(GRPOTrainer):
        def _prepare_inputs(self, generation_batch):
            before = self._buffered_inputs
            inputs = super()._prepare_inputs(generation_batch)
            if self.model.training and self._buffered_inputs is not before:
                recorded.append([{k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                                 for b in self._buffered_inputs])
            return inputs

    rows = args.prompts * args.group
    cfg = GRPOConfig(output_dir=str(out), per_device_train_batch_size=rows // args.micro,
                     gradient_accumulation_steps=args.micro, steps_per_generation=args.micro,
                     num_generations=args.group, max_completion_length=args.new_tokens, learning_rate=args.lr,
                     max_steps=args.steps, beta=0.0, loss_type=args.loss_type, temperature=1.0, top_k=0, top_p=1.0,
                     use_cpu=True, bf16=False, fp16=False, use_vllm=False, report_to="none", logging_steps=10**6,
                     disable_tqdm=True, seed=args.seed, gradient_checkpointing=False, save_strategy="no")
    trainer = Recording(model=str(ckpt), reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    return trainer, recorded


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory, or 'random' (default data/tiny/spread)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per generation batch")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.prompts * args.group % args.micro:
        print(f"bench_trl_skip: --micro {args.micro} does not divide the {args.prompts * args.group} rows",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore")
    from rlcurate.interop.trl_skip import pack

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint_dir(args.model, Path(tmp))
        task = make_task("task", n_train=256, seed=args.seed)
        trainer, recorded = record_generation_batches(ckpt, task, args, Path(tmp) / "trl")
        label = checkpoint_label(ckpt)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.micro

    def passes(batches, model):
        model.zero_grad(set_to_none=True)
        for b in batches:
            trainer._compute_loss(model, b).backward()
        return [p.grad for p in model.parameters()]

    model = copy.deepcopy(trainer.model)
    per_batch, dense_total, packed_total = [], [0.0] * args.repeats, [0.0] * args.repeats
    for k, dense in enumerate(recorded):
        packed, count = pack(dense, args.loss_type)
        g_dense = [g.clone() for g in passes(dense, model)]
        g_packed = passes(packed, model)
        scale = max(float(g.abs().max()) for g in g_dense)
        diff = max(float((a - b).abs().max()) for a, b in zip(g_dense, g_packed))
        times = {"dense": [], "packed": []}
        passes(dense, model), passes(packed, model)  # warm-up
        for r in range(args.repeats):
            for name, batches in (("dense", dense), ("packed", packed)) if r % 2 == 0 else \
                    (("packed", packed), ("dense", dense)):
                t0 = time.perf_counter()
                passes(batches, model)
                times[name].append(time.perf_counter() - t0)
            dense_total[r] += times["dense"][-1]
            packed_total[r] += times["packed"][-1]
        per_batch.append({"generation_batch": k, "rows": count.rows, "rows_dropped": count.dropped_rows,
                          "loss_token_share_dropped": round(count.dropped_loss_tokens / max(count.loss_tokens, 1), 4),
                          "padded_position_share_dropped": round(count.dropped_positions / count.positions, 4),
                          "max_abs_gradient_difference": diff, "max_abs_gradient": scale,
                          "dense": summary(times["dense"]), "packed": summary(times["packed"]),
                          "packed_over_dense": paired_ratio(times["packed"], times["dense"])})
        print(f"generation batch {k}: {count.dropped_rows}/{count.rows} rows dropped, "
              f"{count.dropped_positions / count.positions:.0%} of padded positions; gradient difference "
              f"{diff:.1e} (largest {scale:.1e}); packed/dense time {per_batch[-1]['packed_over_dense']['median_paired_ratio']}")
    overall = paired_ratio(packed_total, dense_total)
    rows = sum(b["rows"] for b in per_batch)
    print(f"all {len(per_batch)} generation batches: {sum(b['rows_dropped'] for b in per_batch)}/{rows} rows dropped; "
          f"training passes packed/dense {overall['median_paired_ratio']} (median of per-round ratios)")
    record = {**header("TRL 1.16 training passes, dense against packed by skip_zero_advantage", args.threads,
                       extra_versions=("trl",)),
              "ratio": "packed training passes / dense ones, per optimizer step's generation batch (< 1: skipping "
                       "saves); median_paired_ratio: median over rounds of the per-round ratio of the times summed "
                       "over the generation batches (dense and packed run back to back)",
              "config": {**vars(args), "checkpoint": label},
              "generation_batches": per_batch, "packed_over_dense": overall,
              "dense_total": summary(dense_total), "packed_total": summary(packed_total)}
    if args.out:
        print(f"written {write_json(record, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
