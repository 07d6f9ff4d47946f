"""Prompt sources and verifiers (chapter 4, *The variance audit*).

A :class:`~rlcurate.tasks.base.Task` yields :class:`~rlcurate.tasks.base.Problem` objects, renders
them as model input with a tokenizer's chat template, and scores completions with a verifier that
never raises on model text.
"""

from rlcurate.tasks.base import Problem, Reward, Task, render_chat

__all__ = ["Problem", "Reward", "Task", "render_chat"]
