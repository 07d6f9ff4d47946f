"""The language model being trained, as a step sees it (chapter 5, *The GRPO loop*).

:class:`LMPolicy` implements :class:`rlcurate.policy.base.Policy` for a causal language model: it
samples with the rollout engine and scores token sequences (:class:`rlcurate.policy.model.ModelPolicy`)
and makes the optimizer step of the clipped surrogate (:mod:`rlcurate.train.loss`):

    samples   = one TrainSample per completion, A = its group's advantage (token weights kept)
    kappa     = aggregation_coefficients(samples, loss_agg)      # over every sample of the batch
    active    = samples with A != 0 (all of them when a KL term needs them)
    for each update epoch, for each minibatch:
        loss = sum over micro-batches of policy_loss(...);  backward;  clip the gradient;  step
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlcurate.curation.base import Group
from rlcurate.policy import scoring
from rlcurate.policy.batching import TrainSample, plan_micro_batches
from rlcurate.policy.model import ModelPolicy
from rlcurate.seeding import stream
from rlcurate.train.config import TrainConfig
from rlcurate.train.loss import aggregation_coefficients, policy_loss

__all__ = ["LMPolicy"]

log = logging.getLogger(__name__)


class LMPolicy(ModelPolicy):
    """A causal language model under training: a :class:`~rlcurate.policy.model.ModelPolicy` (``model``,
    ``tokenizer``, the rollout ``engine`` on the same model) whose :meth:`update` steps ``optimizer``
    with the ``config``'s loss. ``step`` is the step being trained (the trainer sets it; it seeds the
    minibatch split). Micro-batches hold at most ``token_budget`` tokens (``config.micro_batch_tokens``
    unless the trainer sized them from ``micro_batch_memory_gib``)."""

    def __init__(self, model, tokenizer, engine, config: TrainConfig, optimizer, scheduler, *,
                 ref_model=None, autocast: Callable = nullcontext):
        super().__init__(model, tokenizer, engine, token_budget=config.micro_batch_tokens, autocast=autocast)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.config = config
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.ref_model = ref_model
        self.step = 0

    def grad_norms(self, group: Group) -> np.ndarray:
        return scoring.grad_norms(self.model, self.engine.encode([group.prompt])[0], group.completions)

    # ------------------------------------------------------------------ the update
    def samples(self, groups: Sequence[Group], advantages: Sequence[np.ndarray]) -> tuple[list[TrainSample], int]:
        """One :class:`TrainSample` per non-empty completion, with its aggregation coefficients set
        over the whole batch, and the number of completion tokens in it."""
        c = self.config
        samples: list[TrainSample] = []
        n_tokens = 0
        for g, adv in zip(groups, advantages):
            prompt_ids = self.engine.encode([g.prompt])[0]
            for k, comp in enumerate(g.completions):
                if not comp.token_ids:
                    continue
                n_tokens += len(comp.token_ids)
                tw = None if g.token_weights is None else np.asarray(g.token_weights[k], dtype=float)
                samples.append(TrainSample(prompt_ids, list(comp.token_ids), float(adv[k]), tw))
        aggregation_coefficients(samples, c.loss_agg, c.max_new_tokens, n_tokens, len(samples))
        return samples, n_tokens

    def update(self, groups: Sequence[Group], advantages: Sequence[np.ndarray]) -> dict[str, Any]:
        """The optimizer step(s) of one training step (module docstring). Samples with zero advantage
        add nothing to the policy-gradient term: their forward and backward are skipped unless a KL
        term needs them (they still count in the loss normaliser)."""
        c = self.config
        samples, kept_tokens = self.samples(groups, advantages)
        active = samples if c.kl_coef > 0 else [s for s in samples if s.advantage != 0.0]
        out = self.optimize(active)
        out.update(samples_trained=len(samples), samples_nonzero_adv=len(active), kept_tokens=kept_tokens,
                   trained_tokens=sum(len(s.completion_ids) for s in active) * c.update_epochs)
        return out

    def optimize(self, samples: list[TrainSample]) -> dict[str, Any]:
        """``update_epochs`` passes of ``minibatches`` optimizer steps each on ``samples``."""
        c = self.config
        out: dict[str, Any] = {"loss": 0.0, "grad_norm": 0.0, "entropy": 0.0, "clip_frac": 0.0,
                               "approx_kl": 0.0, "kl_ref": 0.0}
        if not samples:  # every group was uniform: nothing to learn, but the schedule moves on
            # No gradient at all, not a stale one: with every grad None the optimizer leaves the
            # parameters (and Adam's moments) untouched; calling it keeps the scheduler's order.
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer.step()
            self.scheduler.step()
            return out
        self.model.train()
        needs_old = c.update_epochs > 1 or c.minibatches > 1
        with torch.no_grad(), self.autocast():
            for mb in plan_micro_batches(samples, self.token_budget):
                batch = [samples[i] for i in mb]
                if needs_old:
                    logp, mask, _ = scoring.forward_logprobs(self.model, batch, c.temperature, self.pad_id)
                    for r, s in enumerate(batch):
                        s.old_logprobs = logp[r, mask[r]].float().cpu()
                if self.ref_model is not None:
                    logp, mask, _ = scoring.forward_logprobs(self.ref_model, batch, c.temperature, self.pad_id)
                    for r, s in enumerate(batch):
                        s.ref_logprobs = logp[r, mask[r]].float().cpu()
        # each minibatch's coefficients were set for the whole batch; a minibatch step rescales them
        rng = stream("minibatch", c.seed, self.step)
        tot = {"loss": 0.0, "entropy_sum": 0.0, "tokens": 0.0, "clipped_sum": 0.0, "approx_kl_sum": 0.0,
               "kl_ref_sum": 0.0}
        norms, skipped = [], 0
        for epoch in range(c.update_epochs):
            order = rng.permutation(len(samples)) if c.minibatches > 1 else np.arange(len(samples))
            for chunk in np.array_split(order, c.minibatches):
                if chunk.size == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                part = [samples[i] for i in chunk]
                scale = c.minibatches  # each minibatch holds ~1/M of the batch's normaliser
                for mb in plan_micro_batches(part, self.token_budget):
                    batch = [part[i] for i in mb]
                    with self.autocast():
                        logp, mask, ent = scoring.forward_logprobs(self.model, batch, c.temperature, self.pad_id,
                                                                   with_entropy=epoch == 0)
                        loss, st = policy_loss(logp, mask, batch, c.clip_low, c.clip_high, c.kl_coef,
                                               c.clip_ratio_c, c.log_ratio_clamp, c.kl_clamp)
                    (loss * scale).backward()
                    tot["loss"] += float(loss.detach())
                    if ent is not None:
                        tot["entropy_sum"] += float((ent * mask).sum())
                    tot["tokens"] += st["tokens"]
                    tot["clipped_sum"] += st["clipped_sum"]
                    tot["approx_kl_sum"] += st["approx_kl_sum"]
                    tot["kl_ref_sum"] += st.get("kl_ref_sum", 0.0)
                if c.grad_clip > 0:
                    norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.grad_clip)
                else:
                    norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in self.model.parameters()
                                          if p.grad is not None))
                norms.append(float(norm))
                if not math.isfinite(norms[-1]):  # a NaN or infinite gradient would poison the weights
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                self.optimizer.step()
        self.scheduler.step()
        if skipped:
            out["nonfinite_grad_steps"] = skipped
            log.warning("step %d: %d optimizer step(s) skipped: the gradient norm was not finite",
                        self.step + 1, skipped)
        first_epoch_tokens = sum(len(s.completion_ids) for s in samples)
        out.update(loss=tot["loss"] / c.update_epochs, grad_norm=float(np.mean(norms)),
                   entropy=tot["entropy_sum"] / max(first_epoch_tokens, 1),
                   clip_frac=tot["clipped_sum"] / max(tot["tokens"], 1),
                   approx_kl=tot["approx_kl_sum"] / max(tot["tokens"], 1),
                   kl_ref=tot["kl_ref_sum"] / max(tot["tokens"], 1))
        return out
