"""Task options that follow from the model, for ``rlcurate train`` and ``rlcurate audit`` (chapter 4).

The arithmetic task has two prompt styles (:mod:`rlcurate.tasks.arithmetic`): ``tiny``, the tiny
model's own template (``<|user|>47+85=<|assistant|>``, scratchpad, then ``#132``), and ``chat``,
three few-shot chat turns and the assistant prefill ``47 + 85 =`` for a real instruct model.
SmolLM2-135M-Instruct never answers in the tiny format (0 % reward), and about a third of its
chat-style answers are right, with mixed pass rates (reference/smollm2.md). So ``--model smollm2``
with the arithmetic task picks the chat style unless the task's ``style`` is given.
"""

from __future__ import annotations

__all__ = ["task_kwargs_for"]


def task_kwargs_for(model, task, task_kwargs) -> tuple[dict, str | None]:
    """``(task_kwargs, note)``: the task options with those ``model`` needs and the user did not give
    added, and a one-line note naming what was chosen (``None`` when nothing was). Anything that is
    not a model name, task name and dict is returned as it is (the configs' own checks name it)."""
    if (model == "smollm2" and isinstance(task, str) and task.strip().lower() == "arithmetic"
            and isinstance(task_kwargs, dict) and "style" not in task_kwargs):
        return {**task_kwargs, "style": "chat"}, (
            "model smollm2: the arithmetic task uses its chat style (few-shot turns, the prefill "
            "'A + B ='); give the task option style to choose another")
    return task_kwargs, None
