"""DRO on GSM8K (chapter 8): the reference answer replaces the rollout's own ``#### <number>`` line.

Without ``GSM8K.split`` the DRO processor treated a whole GSM8K completion as reasoning, so the
reference answer was teacher-forced *after* the rollout's own final answer, and two rollouts with the
same reasoning but different final numbers got different l_ij (sigma > 0).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlcurate.curation.base import Group, StepContext
from rlcurate.curation.dro import DROProcessor, reference_answer_text
from rlcurate.policy.model import ModelPolicy
from rlcurate.rollout.base import Completion
from rlcurate.tasks.gsm8k import GSM8K


def test_gsm8k_split_cuts_at_the_last_marker():
    task = GSM8K.__new__(GSM8K)  # split needs no data
    assert task.split("She has 3.\n#### 3") == ("She has 3.", "3")
    assert task.split("a #### 1\nb\n####  42 apples") == ("a #### 1\nb", "42 apples")
    assert task.split("no marker, 42") == ("no marker, 42", None)
    assert task.split("") == ("", None)
    with pytest.raises(ValueError):
        task.split(None)


@pytest.fixture(scope="module")
def tiny_qwen(shared_data):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    tok = AutoTokenizer.from_pretrained(shared_data / "qwen2.5-tokenizer")
    return model, tok


def test_dro_on_gsm8k_teacher_forces_the_reference_after_the_reasoning_only(shared_data, tiny_qwen):
    model, tok = tiny_qwen
    task = GSM8K(shared_data)
    problem = task.problems("test")[0]
    reasoning = "Step one.\nStep two."
    texts = [f"{reasoning}\n#### {problem.answer}", f"{reasoning}\n#### 1{problem.answer}", f"{reasoning}\n####7"]
    prompt = "Question: " + problem.question + "\nAnswer:"
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    eos = tok.eos_token_id
    comps = [Completion(prompt_index=0, sample_index=j, prompt_token_ids=prompt_ids,
                        token_ids=tok.encode(t, add_special_tokens=False) + [eos], text=t,
                        logprobs=[0.0] * 50, finish_reason="stop") for j, t in enumerate(texts)]
    g = Group(index=0, problem=problem, prompt=prompt, completions=comps,
              rewards=np.array([task.reward(problem, t).value for t in texts]))
    assert g.rewards.tolist() == [1.0, 0.0, 0.0]
    ctx = StepContext(step=0, seed=0, problems=[problem], task=task, group_size=3, prompts_per_step=1,
                      policy=ModelPolicy(model, tok))
    (st,) = DROProcessor(use_as="token_weights").statistics(ctx, [g])
    y_text = reference_answer_text(task, problem)
    assert y_text == f"\n#### {problem.answer}"
    y_ids = tok.encode(y_text, add_special_tokens=False) + [eos]
    assert st.answer_ids == y_ids
    # the reasoning is the longest token prefix of the completion that stays inside the text before
    # "\n####" (a BPE token such as ".\n" across the cut is left out): the same for the three
    k = st.reasoning_tokens[0]
    assert st.reasoning_tokens == [k, k, k] and st.answer_start == [k, k, k]
    prefix = tok.decode(comps[0].token_ids[:k])
    assert reasoning.startswith(prefix) and len(prefix) >= len(reasoning) - 2
    # same reasoning, so the reference answer is scored in the same context: sigma = 0
    assert np.abs(st.sigma).max() < 1e-6
    with torch.no_grad():
        ids = prompt_ids + comps[0].token_ids[:k] + y_ids
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    n = len(y_ids)
    direct = [float(logp[len(ids) - n - 1 + j, ids[len(ids) - n + j]]) for j in range(n)]
    np.testing.assert_allclose(st.ell[0], direct, atol=1e-4)
