"""Reinforce-Ada (Xiong, Ye, Liao, Dong et al., 2025), chapter 6, *Adaptive sampling*.

Two ways to spend more rollouts where the signal is hard to find.

**Ada-Seq** (sequential sampling, the paper's Alg. 2). Rounds t = 1..``max_rounds``: every prompt still
active gets ``round_repeat`` (M) new rollouts; a prompt leaves when its pool satisfies the exit rule

    balanced:  #pos >= n//2  and  #neg >= n - n//2          (ada_seq_balanced)
    positive:  #pos >= k_pos                                 (ada_seq_positive, k_pos = 1)

with "positive" meaning reward > ``positive_threshold`` (0.7) and n the training group size. Then each
pool of N rollouts is *downsampled* to n: the first min(n//2, #pos) positives, negatives to fill, topped
up from whichever class has spares; a pool that never met its rule keeps a fallback group, possibly
smaller than n. The baseline is the pool's pass rate p_hat = N_pos / N, not the group's:
A_j = r_j - p_hat (``advantage="drgrpo"``, the released script's ``norm_adv_by_std_in_grpo=False``),
or GRPO standardised with the pool's mean and std (``"grpo"``, verl's ``global_stat_est``). The v3 paper
adds an explicit correction ("oversample, downsample, correct"),

    g_hat(x) = (1 / p_hat) (1/n) sum_j (r_j - p_hat) grad log pi(a_j | x),

written here into ``Group.weight`` when ``correction="inverse_p"`` (the released code has none).

What the balanced downsample does to the gradient, computed exactly (W(p) with E[g_hat] = W(p) grad p,
against the objectives' f'(p)): :mod:`rlcurate.curation.ada_analysis`.

**Ada-Est** (the paper's Alg. 1 with the public prototype's Bayesian estimate). Each prompt keeps
decayed counts, N_tot <- lam N_tot + n, N_pos <- lam N_pos + k, and the estimate
p_hat = (N_pos + alpha) / (N_tot + alpha + beta); rollouts are allocated in proportion to the
objective's weight w(p_hat) (log: 1/p_hat, as in the prototype), at least ``n_min`` each, within a total
budget of ``group_size`` per prompt; all samples are trained (:func:`~rlcurate.curation.ada_est.bounded_proportional_allocation`:
``n_min`` each, then the rest in proportion to the weights, so n_i - n_min is proportional to them).
``hybrid=True`` follows the paper's Alg. 1: weights 1/sqrt(p_hat + eps) and an extra group weight
1/sqrt(r_bar + eps); the paper clips n_i proportional to 1/sqrt(p_hat + eps) to [N_min, N_max], which this
rule's floor-then-share makes flatter (chapter 6).

*Graded rewards, and the statistics of the advantage.* Both variants follow the official code's
``global_stat_est=True`` (the released script's setting): a rollout is a success iff its reward
exceeds ``positive_threshold``, and the baseline p_hat and the std of the advantage are those of the
*binarised* pool (Ada-Seq: every rollout generated for the prompt this step; Ada-Est: its trained
group), :func:`rlcurate.stats.advantages.pool_advantages`. The reward itself enters with its value.
So a graded reward is judged against the pool's *pass rate*, not against the mean reward: in a group
[0, 1, .5, .5, .5, 1, .5, .5] (2 successes of 8) a partial-credit 0.5 gets A = 0.5 - 0.25 = +0.25 under
Dr. GRPO, where the raw group mean 0.5625 would give it -0.0625. The std of the binarised pool is
floored at 1 / sqrt(N) (the std of a pool with one success), so a pool without successes and graded
kept rewards gets |A| <= sqrt(N) (the official code clamps it at eps: 0.1 / 2e-6 = 50000). With 0/1
rewards everything above is the plain pool (or group) statistics. ``global_stat_est=False`` uses the
statistics of the kept group's own raw rewards instead (the official option of the same name).

Reference options not offered: Ada-Est with a learned value network V_phi(x) for p_hat (the paper's
other estimate; no released code), the Tinker port's baseline accumulated over all epochs (it is not
the verl code), and the fork-only ``min_positive_samples``, ``correct_bias``, ``diy_reweight``.

Defaults. Code (RLHFlow/Reinforce-Ada, verl): ``max_rounds=4``, ``round_repeat=8``,
``positive_threshold=0.7``, n = 4 in the released script (budget <= 32 per prompt); here n is the run's
``group_size``. Paper text examples: M = 16, N_max = 128, n = 16, K_pos = 16 or K_pos = K_neg = 8;
paper experiments: n = 4, N_max = 32. Ada-Est prototype (branch ``hanze``): alpha = 1, beta = 16,
lam = 0.9, weights 1/p_hat, at least one rollout per prompt, one generation round; the paper leaves
lam, alpha, beta, eps, N_min, N_max unspecified.

The code, one idea per module, every name importable from here: :mod:`rlcurate.curation.ada_seq`
(the exit rules, the downsample, the correction; ``ada_seq_balanced`` and ``ada_seq_positive``),
:mod:`rlcurate.curation.ada_analysis` (the exact law of an Ada-Seq pool and the estimator's weight
:func:`seq_effective_weight`) and :mod:`rlcurate.curation.ada_est` (``ada_est``).
"""

from __future__ import annotations

from rlcurate.curation.ada_analysis import seq_effective_weight, seq_expected_rollouts, seq_pool_distribution
from rlcurate.curation.ada_est import AdaEstConfig, AdaEstSampler, bounded_proportional_allocation
from rlcurate.curation.ada_seq import (
    CORRECTIONS,
    POSITIVE_THRESHOLD,
    AdaSeqBalancedConfig,
    AdaSeqDownsample,
    AdaSeqPositiveConfig,
    AdaSeqSampler,
    SeqRule,
    correction_weight,
    downsample_plan,
)

__all__ = ["SeqRule", "AdaSeqSampler", "AdaSeqDownsample", "AdaEstSampler", "downsample_plan",
           "correction_weight", "seq_pool_distribution", "seq_effective_weight", "seq_expected_rollouts",
           "bounded_proportional_allocation", "AdaSeqBalancedConfig", "AdaSeqPositiveConfig", "AdaEstConfig",
           "CORRECTIONS", "POSITIVE_THRESHOLD"]
