"""Closed-form statistics of pass rates (numpy and scipy only; no torch).

=====================  ==========================================================  =========
module                 what                                                        chapter
=====================  ==========================================================  =========
``gate``               u(p, G), advantage energy, effective-prompt ratio           1
``passk``              unbiased pass@k and pass@k curves                           1
``objectives``         J_f = E f(p), weights f'(p), smoothing and clipping         2
``allocation``         variance-optimal rollouts, GVM, tiered escalation cost      3
``audit``              audit metrics, zero-variance odds, credible intervals       4
``beliefs``            Beta beliefs, mutual information, INSIGHT, MoPPS            9
=====================  ==========================================================  =========
"""

from rlcurate.stats import advantages
from rlcurate.stats.allocation import (
    allocation_variance,
    continuous_allocation,
    cross_fitted_allocation_ratio,
    escalation_cost,
    escalation_cost_from_coverage,
    gvm_allocation,
    optimal_allocation,
    plug_in_allocation_ratio,
    round_preserving_sum,
    variance_coefficients,
)
from rlcurate.stats.audit import (
    CATEGORIES,
    as_score_rows,
    categorize,
    category_counts,
    fit_beta_prior,
    group_mixed_prob,
    hidden_signal_prob,
    improvement_potential,
    prior_degeneracy,
    recipe_multiplier_rule,
    runs_needed,
    sample_metrics,
    share_interval,
    threshold_side,
    zero_variance_prob,
)
from rlcurate.stats.beliefs import (
    BetaBeliefs,
    beta_entropy,
    expected_variance_reduction,
    insight_score,
    insight_weight,
    mopps_select,
    mutual_information,
    top_m,
)
from rlcurate.stats.gate import (
    advantage_energy,
    effective_prompt_ratio,
    expected_advantage_energy,
    gate_max,
    gate_open_prob,
    gate_open_prob_small_p,
    is_mixed,
)
from rlcurate.stats.objectives import (
    OBJECTIVES,
    Objective,
    clip_pass_rate,
    effective_weight,
    get_objective,
    grpo_effective_weight,
    smooth_pass_rate,
)
from rlcurate.stats.passk import pass_at_k, pass_at_k_curve, pass_at_k_exact

__all__ = [name for name in dir() if not name.startswith("_") and name not in {"allocation", "audit", "beliefs", "gate", "objectives", "passk"}]
