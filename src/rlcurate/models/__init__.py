"""Models (chapter 4): the tiny Qwen2-architecture model and its tokenizer, the offline
SmolLM2-135M-Instruct, and loading of any Hugging Face causal LM by id or path."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def load_policy(spec: str, device: str = "auto", dtype: str = "auto"):
    """``(model, tokenizer)`` for a training or audit run: ``smollm2`` (the offline
    SmolLM2-135M-Instruct), or any local checkpoint directory or Hugging Face Hub id (the tiny
    checkpoints in ``data/tiny`` are ordinary checkpoints). See :func:`rlcurate.models.hf.load_causal_lm`.
    Under ``RLCURATE_DRYRUN=1`` a known Hub id loads a random-weight checkpoint of its architecture
    (:func:`rlcurate.dryrun.dry_run_checkpoint`)."""
    from rlcurate.models.dry_run import dry_run_model
    from rlcurate.models.hf import load_causal_lm, load_smollm2

    stand_in = dry_run_model(spec)  # a chapter's dry run (RLCURATE_DRYRUN=1): random weights, same architecture
    if stand_in is not None:
        log.warning("dry run: %s is a random-weight checkpoint of its architecture (%s)", spec, stand_in)
        spec = str(stand_in)
    if spec == "smollm2":
        return load_smollm2(dtype="float32" if dtype in ("fp32", "auto") else dtype, device=device)
    return load_causal_lm(spec, dtype="float32" if dtype == "fp32" else dtype, device=device)


__all__ = ["load_policy"]
