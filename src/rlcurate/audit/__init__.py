"""The variance audit (chapter 4, *The variance audit*).

Before training a model with group-sampled RL, run it N times on every prompt and look at how its
scores vary: prompts it always solves or always fails give GRPO nothing to learn from, and only the
*mixed* ones carry signal. This package runs such an audit with any rollout backend and summarises it.

==========================  ====================================================================
:func:`run_audit`           sample N completions per prompt, score them, append to ``runs.jsonl``
                            batch by batch (resumable after any interruption, SIGTERM recorded,
                            deterministic per chunk of samples)
:func:`load_audit`          read an audit folder back as a score matrix
:func:`summarize`           the verdict first (reward-function errors and truncation, which
                            invalidate it; one run; the mixed share with its interval), categories,
                            best-of-N vs mean, pass@k, zero-variance odds, the gate by group size
:func:`write_summary`       ``summary.json``, ``samples.jsonl``, ``mixed.jsonl`` and the figures
:mod:`rlcurate.audit.plots` the variance plot, the pass-count histogram, P(zero variance) curves
``rlcurate audit``          the command line (:mod:`rlcurate.audit.cli`)
==========================  ====================================================================

:mod:`~rlcurate.audit.runner` holds the run loop; the configuration is in :mod:`~rlcurate.audit.config`,
the audit order, chunk seeds and batches in :mod:`~rlcurate.audit.seeds`, the folder's files and lock
in :mod:`~rlcurate.audit.store`, model and data loading in :mod:`~rlcurate.audit.loading`. The
statistics themselves (no I/O) are in :mod:`rlcurate.stats.audit`.
"""

from rlcurate.audit.runner import (
    AuditConfig,
    AuditError,
    AuditStopped,
    AuditTerminated,
    audit_order,
    chunk_seed,
    make_engine,
    read_runs,
    run_audit,
)
from rlcurate.audit.report import format_summary, per_sample_rows, write_summary
from rlcurate.audit.summary import Audit, beta_uniform_prob, load_audit, summarize

__all__ = [
    "Audit",
    "AuditConfig",
    "AuditError",
    "AuditStopped",
    "AuditTerminated",
    "audit_order",
    "beta_uniform_prob",
    "chunk_seed",
    "format_summary",
    "load_audit",
    "make_engine",
    "per_sample_rows",
    "read_runs",
    "run_audit",
    "summarize",
    "write_summary",
]
