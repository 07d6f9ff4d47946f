"""The trainer on a real pretrained model that works offline: SmolLM2-135M-Instruct (chapter 5).

One GRPO step on two arithmetic prompts with the chat-prefill format: the metrics line is written,
the loss and gradient norm are finite, and the weights move when some group is mixed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlcurate.tasks.arithmetic import ArithmeticTask
from rlcurate.train import Trainer, TrainConfig


@pytest.mark.slow
def test_one_grpo_step_on_smollm2(tmp_path):
    from rlcurate.models.hf import load_smollm2

    model, tok = load_smollm2()  # the cached export, or the GGUF file once (~15-30 s)
    task = ArithmeticTask(levels=["add2"], style="chat", n_train=4, n_test=2, seed=1)
    before = model.get_input_embeddings().weight.detach().clone()
    cfg = TrainConfig(model="smollm2", task="arithmetic", steps=1, prompts_per_step=2, group_size=4,
                      max_new_tokens=4, lr=1e-5, eval_every=0, out_dir=str(tmp_path), progress=False,
                      save_model=False, seed=0)
    Trainer(cfg, model=model, tokenizer=tok, task=task).run()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    r = rows[0]
    assert r["rollouts"] == 8 and r["groups_trained"] == 2
    assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) and np.isfinite(r["entropy"])
    moved = not torch.equal(before, model.get_input_embeddings().weight.detach())
    assert moved == (r["samples_nonzero_adv"] > 0)
