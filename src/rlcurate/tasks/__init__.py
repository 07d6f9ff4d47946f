"""Prompt sources and verifiers (chapter 4, *The variance audit*).

A :class:`~rlcurate.tasks.base.Task` yields :class:`~rlcurate.tasks.base.Problem` objects, renders
them as model input with a tokenizer's chat template, and scores completions with a verifier that
never raises on model text. ``get_task(name, **kwargs)`` builds one by name: ``arithmetic`` (the tiny
world), ``gsm8k``, ``math``, ``math500``, ``math_l3to5``, ``countdown``.
"""

from rlcurate.tasks.base import Problem, Reward, Task, render_chat
from rlcurate.tasks.registry import available_tasks, get_task, register_task

__all__ = ["Problem", "Reward", "Task", "render_chat", "get_task", "register_task", "available_tasks"]
