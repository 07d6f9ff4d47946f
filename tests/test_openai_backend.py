"""The OpenAI-compatible HTTP backend against this package's own server (chapter 4).

A tiny random checkpoint is saved to disk and served by ``python -m rlcurate.rollout.server`` in a
subprocess; :class:`OpenAIEngine` must then return exactly what :class:`TransformersEngine` returns
locally for the same prompts, counts and per-prompt seeds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from test_rollout import PROMPTS, char_tokenizer, tiny_model

from rlcurate.rollout import (MalformedResponseError, OpenAIEngine, OpenAIServerError, SamplingParams,
                              TransformersEngine, prompt_seed)
from rlcurate.rollout.server import make_server

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

NAME = "tiny-random"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-ckpt")
    tiny_model().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def local(checkpoint):
    return TransformersEngine.from_pretrained(str(checkpoint))


@pytest.fixture(scope="module")
def server_url(checkpoint):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcurate.rollout.server", "--model", str(checkpoint), "--port", "0",
         "--served-model-name", NAME, "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "... serving 'tiny-random' on http://127.0.0.1:PORT/v1"
        if "http://" not in line:
            proc.kill()
            pytest.fail(f"server did not start: {line!r} {proc.stderr.read()[-2000:]}")
        yield line.strip().split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def remote(server_url):
    return OpenAIEngine(server_url, NAME, timeout=60, max_retries=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_models_endpoint(remote):
    assert remote.models() == [NAME]


def test_remote_equals_local_engine(remote, local):
    params = SamplingParams(max_new_tokens=10)
    counts = [2, 0, 3, 1]
    out = remote.generate(PROMPTS, counts, params, seed=5)
    assert [len(g) for g in out] == counts
    for i, group in enumerate(out):
        if not counts[i]:
            continue
        want = local.generate([PROMPTS[i]], counts[i], params, seed=prompt_seed(5, i))[0]
        for j, (got, ref) in enumerate(zip(group, want)):
            assert (got.prompt_index, got.sample_index) == (i, j)
            assert got.prompt_token_ids == ref.prompt_token_ids
            assert got.token_ids == ref.token_ids
            assert got.text == ref.text
            assert got.finish_reason == ref.finish_reason
            np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-6, rtol=0)


def test_remote_is_deterministic_for_a_seed(remote):
    params = SamplingParams(max_new_tokens=8)
    a = remote.generate(PROMPTS, 3, params, seed=1)
    assert a == remote.generate(PROMPTS, 3, params, seed=1)
    assert [[c.token_ids for c in g] for g in a] != [
        [c.token_ids for c in g] for g in remote.generate(PROMPTS, 3, params, seed=2)]


def test_remote_token_id_prompts(remote, local):
    params = SamplingParams(temperature=0, max_new_tokens=6)
    ids = [local.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    by_ids = remote.generate(ids, 1, params)
    by_text = remote.generate(PROMPTS, 1, params)
    assert [g[0].token_ids for g in by_ids] == [g[0].token_ids for g in by_text]
    assert [g[0].prompt_token_ids for g in by_ids] == ids


def test_remote_stop_strings(remote, server_url):
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    ref = remote.generate(PROMPTS[:1], 1, greedy)[0][0]
    stop = ref.text[3:5]
    end = ref.text.find(stop) + len(stop)
    params = SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,))
    c = remote.generate(PROMPTS[:1], 1, params)[0][0]
    assert c.finish_reason == "stop"
    assert c.text == ref.text[:end]  # inclusive, this package's convention
    assert c.token_ids == ref.token_ids[: len(c.token_ids)]
    # a plain OpenAI client gets the OpenAI convention: the stop string cut off, no token ids
    plain = OpenAIEngine(server_url, NAME, vllm_extras=False).generate(PROMPTS[:1], 1, params)[0][0]
    assert plain.text == ref.text[: end - len(stop)] and plain.finish_reason == "stop"
    assert plain.token_ids == [] and len(plain.logprobs) == len(c.token_ids)


def test_server_batches_several_prompts_in_one_request(remote, local):
    body = {"model": NAME, "prompt": PROMPTS[:2], "n": 2, "max_tokens": 5, "seed": 4, "logprobs": 0,
            "return_token_ids": True}
    payload = remote._request("POST", "/completions", body)
    want = local.generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=5), seed=4)
    assert [c["token_ids"] for c in payload["choices"]] == [c.token_ids for g in want for c in g]
    assert [c["index"] for c in payload["choices"]] == [0, 1, 2, 3]
    assert payload["usage"]["completion_tokens"] == sum(len(c.token_ids) for g in want for c in g)
    for flag in ("stream", "echo"):
        with pytest.raises(OpenAIServerError, match=f"400.*{flag}"):
            remote._request("POST", "/completions", {**body, flag: True})


def test_dead_port_gives_a_clear_error():
    engine = OpenAIEngine(f"http://127.0.0.1:{free_port()}/v1", NAME, timeout=5, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match="cannot reach"):
        engine.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=2))
    assert time.perf_counter() - t0 < 5


def test_http_errors_carry_the_server_message(server_url, remote):
    wrong = OpenAIEngine(server_url, "no-such-model", max_retries=0)
    with pytest.raises(OpenAIServerError, match="404.*no-such-model.*does not exist") as info:
        wrong.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=2))
    assert info.value.status == 404
    with pytest.raises(OpenAIServerError, match="400.*repetition_penalty"):
        remote._request("POST", "/completions", {"model": NAME, "prompt": "1", "repetition_penalty": 1.3})
    with pytest.raises(OpenAIServerError, match="400.*vocabulary"):
        remote.generate([[5, 4000]], 1, SamplingParams(max_new_tokens=2))


def test_in_process_server_and_bare_base_url(local):
    server = make_server(local, port=0, model_name="x")
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        host, port = server.server_address[:2]
        engine = OpenAIEngine(f"http://{host}:{port}", "x")  # "/v1" is added
        assert engine.base_url.endswith("/v1")
        out = engine.generate(PROMPTS[:2], [1, 2], SamplingParams(max_new_tokens=3), seed=0)
        assert [len(g) for g in out] == [1, 2]
    finally:
        server.shutdown()
        server.server_close()


class _Junk(BaseHTTPRequestHandler):
    replies = {"/v1/completions": b'{"choices": [{"text": 3}]}', "/v1/models": b"not json"}

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply()

    def do_GET(self):
        self._reply()

    def _reply(self):
        data = self.replies[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_malformed_responses_are_reported():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Junk)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        engine = OpenAIEngine(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", max_retries=0)
        with pytest.raises(MalformedResponseError, match="not return JSON"):
            engine.models()
        with pytest.raises(MalformedResponseError, match="'text'"):
            engine.generate(["hi"], 1, SamplingParams(max_new_tokens=2))
        with pytest.raises(MalformedResponseError, match="n=2"):
            engine.generate(["hi"], 2, SamplingParams(max_new_tokens=2))
    finally:
        server.shutdown()
        server.server_close()


def test_request_body_and_argument_checks():
    engine = OpenAIEngine("http://127.0.0.1:1/v1", "m")
    body = engine.request_body("hi", 4, SamplingParams(top_k=0, stop=("\n",)), seed=3)
    assert body["n"] == 4 and body["top_k"] == -1 and body["stop"] == ["\n"] and body["logprobs"] == 1
    assert json.loads(json.dumps(body)) == body
    with pytest.raises(ValueError, match="top_k"):
        OpenAIEngine("http://127.0.0.1:1/v1", "m", vllm_extras=False).generate(
            ["hi"], 1, SamplingParams(top_k=5))
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("localhost:8000", "m")
    with pytest.raises(ValueError, match="n"):
        engine.generate(["hi"], -1, SamplingParams())


# ---------------------------------------------------------------- the official openai client, chat


@pytest.fixture(scope="module")
def thread_url(local):
    """The real server (make_server) on 127.0.0.1, port 0, in a thread of this process."""
    server = make_server(local, host="127.0.0.1", port=0, model_name=NAME)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def client(thread_url):
    import openai

    return openai.OpenAI(base_url=thread_url, api_key="unused", max_retries=0, timeout=60)


def test_openai_client_completions(client, local):
    prompt = PROMPTS[0]
    r = client.completions.create(model=NAME, prompt=prompt, n=3, max_tokens=8, seed=11, logprobs=1)
    want = local.generate([prompt], 3, SamplingParams(max_new_tokens=8), seed=11)[0]
    assert [c.text for c in r.choices] == [c.text for c in want]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in want)
    assert r.usage.prompt_tokens == len(want[0].prompt_token_ids)
    np.testing.assert_allclose(r.choices[0].logprobs.token_logprobs, want[0].logprobs, atol=1e-6, rtol=0)
    again = client.completions.create(model=NAME, prompt=prompt, n=3, max_tokens=8, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    other = client.completions.create(model=NAME, prompt=prompt, n=3, max_tokens=8, seed=12)
    assert [c.text for c in other.choices] != [c.text for c in r.choices]


def test_openai_client_chat_completions(client, local):
    from rlcurate.tasks.base import render_chat

    messages = [{"role": "user", "content": "12+34="}]
    r = client.chat.completions.create(model=NAME, messages=messages, n=2, max_tokens=8, seed=5, logprobs=True)
    assert r.object == "chat.completion" and len(r.choices) == 2
    want = local.generate([render_chat(local.tokenizer, messages)], 2, SamplingParams(max_new_tokens=8), seed=5)[0]
    assert [c.message.content for c in r.choices] == [c.text for c in want]
    assert all(c.message.role == "assistant" for c in r.choices)
    assert [c.finish_reason for c in r.choices] == [c.finish_reason for c in want]
    assert [len(c.logprobs.content) for c in r.choices] == [len(c.token_ids) for c in want]
    np.testing.assert_allclose([e.logprob for e in r.choices[1].logprobs.content], want[1].logprobs, atol=1e-6,
                               rtol=0)
    assert r.usage.prompt_tokens == len(want[0].prompt_token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + sum(len(c.token_ids) for c in want)
    again = client.chat.completions.create(model=NAME, messages=messages, n=2, max_tokens=8, seed=5)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    # a prefill: the vLLM extension continue_final_message continues the last assistant message
    prefill = [*messages, {"role": "assistant", "content": "4+2"}]
    cont = client.chat.completions.create(
        model=NAME, messages=prefill, max_tokens=6, seed=5,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    want = local.generate([render_chat(local.tokenizer, messages, "4+2")], 1, SamplingParams(max_new_tokens=6),
                          seed=5)[0]
    assert cont.choices[0].message.content == want[0].text


def test_openai_client_sees_error_objects(client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "1"}], n=0)
    assert info.value.status_code == 400
    assert info.value.body["param"] == "n" and "n must be an integer >= 1" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="other", prompt="1", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="roles user and assistant"):
        client.chat.completions.create(model=NAME, messages=[{"role": "system", "content": "be brief"}])


def test_engine_chat_endpoint_equals_the_completions_endpoint(thread_url, local):
    """An audit may use either endpoint: the chat turns (with a hint as the assistant prefill) give the
    same prompts, so the same completions, token ids and log-probs."""
    from rlcurate.rollout.openai_api import conversation
    from rlcurate.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(levels=["add2", "mul2x1"], n_test=4, seed=0)
    problems = task.problems("test")[:3]
    hints = [None, task.hint(problems[1], 1), None]
    convs = [conversation(task, p, h) for p, h in zip(problems, hints)]
    assert convs[1][-1] == {"role": "assistant", "content": task.prefill(problems[1], hints[1])}
    texts = [task.render(p, local.tokenizer, h) for p, h in zip(problems, hints)]
    params = SamplingParams(max_new_tokens=12)
    chat = OpenAIEngine(thread_url, NAME, endpoint="chat").generate(convs, [2, 1, 2], params, seed=3)
    comp = OpenAIEngine(thread_url, NAME).generate(texts, [2, 1, 2], params, seed=3)
    assert [[c.text for c in g] for g in chat] == [[c.text for c in g] for g in comp]
    assert [[c.token_ids for c in g] for g in chat] == [[c.token_ids for c in g] for g in comp]
    assert [[c.prompt_token_ids for c in g] for g in chat] == [[c.prompt_token_ids for c in g] for g in comp]
    for g, h in zip(chat, comp):
        for a, b in zip(g, h):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    # a plain string is one user turn
    one = OpenAIEngine(thread_url, NAME, endpoint="chat").generate(["12+34="], 1, params, seed=1)[0][0]
    assert one.prompt_token_ids == local.encode(["<|user|>12+34=<|assistant|>"])[0]


def test_engine_chat_arguments_are_checked_before_any_request():
    dead = "http://127.0.0.1:1/v1"
    plain_chat = OpenAIEngine(dead, "m", endpoint="chat", vllm_extras=False)
    with pytest.raises(ValueError, match="prefill.*vllm_extras=True"):
        plain_chat.generate([[{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]], 1,
                            SamplingParams())
    with pytest.raises(ValueError, match=r"prompts\[0\]\[0\]\.role must be one of"):
        OpenAIEngine(dead, "m", endpoint="chat").generate([[{"role": "robot", "content": "1"}]], 1, SamplingParams())
    with pytest.raises(ValueError, match="endpoint must be one of completions, chat"):
        OpenAIEngine(dead, "m", endpoint="responses")
    body = OpenAIEngine(dead, "m", endpoint="chat").request_body([{"role": "user", "content": "1"}], 2,
                                                                 SamplingParams(), seed=4)
    assert body["messages"] == [{"role": "user", "content": "1"}] and body["logprobs"] is True
    assert "prompt" not in body and "continue_final_message" not in body


def test_audit_over_either_endpoint_gives_the_same_runs(thread_url, checkpoint, tmp_path, capsys):
    from rlcurate.cli import main

    common = ["audit", "--backend", "openai", "--base-url", thread_url, "--model-name", NAME, "--task", "arithmetic",
              "--task-kwargs", '{"levels": ["add2"], "n_test": 4}', "--runs", "2", "--max-new-tokens", "10",
              "--no-plots", "--quiet"]
    assert main([*common, "--model", str(checkpoint), "--out", str(tmp_path / "completions")]) == 0
    assert main([*common, "--endpoint", "chat", "--out", str(tmp_path / "chat")]) == 0  # no tokenizer needed
    capsys.readouterr()
    runs = [[{k: r[k] for k in ("uid", "run", "completion", "score")} for r in map(json.loads, lines)]
            for lines in ((tmp_path / d / "runs.jsonl").read_text().splitlines() for d in ("completions", "chat"))]
    assert len(runs[0]) == 8 and runs[0] == runs[1]
    assert json.loads((tmp_path / "chat" / "config.json").read_text())["config"]["endpoint"] == "chat"
