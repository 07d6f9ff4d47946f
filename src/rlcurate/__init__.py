"""rlcurate: curating the learning signal in group-sampled RL on language models.

The package follows the book *Curating the Learning Signal* (``book/``):

==========================  =====================================================
module                      chapter
==========================  =====================================================
``rlcurate.stats``          closed-form math on pass rates (chapters 1-3, 5, 8)
``rlcurate.sim``            a simulated world with exact policy gradients (1-3, 9)
``rlcurate.tasks``          prompt sources and verifiers (4)
``rlcurate.models``         the tiny Qwen2 model, SmolLM2, Hub checkpoints (4)
``rlcurate.rollout``        generation backends (4)
``rlcurate.audit``          the variance audit (4)
``rlcurate.train``          the GRPO trainer (5-9)
``rlcurate.curation``       curation strategies (5-9)
``rlcurate.book``           notebook helpers: profiles, plot style, recorded values
==========================  =====================================================

``import rlcurate`` stays light (numpy and scipy only); torch is imported by the modules that need it.
"""

__version__ = "0.1.0"
