"""Bad inputs around the OpenAI-compatible server and its client (issue #12, table rows D*).

Our server answers a bad request with an OpenAI-style error object and keeps serving; the client
(:class:`OpenAIEngine`, the audit's ``openai`` backend) turns a server that misbehaves (not JSON, the
wrong schema, HTTP 500, no connection, no answer, not HTTP at all) into one exception whose message
names the URL and what was wrong; an audit stopped that way keeps every finished run. Plus the
command line's own misuse: an unknown command, unknown options, unknown strategies."""

from __future__ import annotations

import http.client
import json
import logging
import unittest.mock as mock
import select
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_rollout import char_tokenizer, tiny_model

from rlcurate.cli import main
from rlcurate.rollout import (MalformedResponseError, OpenAIEngine, OpenAIServerError, RolloutEngine,
                              SamplingParams, TransformersEngine)
from rlcurate.rollout.server import ServerLimits, make_server

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

NAME = "tiny"
P = SamplingParams(max_new_tokens=4)


def one_line_error(err: str, *needles: str) -> str:
    """The CLI convention: exactly one non-empty line on stderr, no traceback, naming the input."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def serve(handler_or_engine, name: str = NAME):
    """Start a server in a thread; returns (server, base URL)."""
    if isinstance(handler_or_engine, type):
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_or_engine)
        server.handle_error = lambda *args: None  # a client that timed out is gone: no traceback
    else:
        server = make_server(handler_or_engine, port=0, model_name=name)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def stop(server):
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def engine():
    return TransformersEngine(tiny_model(), char_tokenizer())


@pytest.fixture(scope="module")
def url(engine):
    server, base = serve(engine)
    yield base
    stop(server)


def post(base: str, path: str, raw: bytes, headers: dict | None = None) -> tuple[int, dict]:
    host, port = base.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1" + path, body=raw, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    status, payload = resp.status, json.loads(resp.read())
    conn.close()
    return status, payload


def assert_error(status_payload, status: int, param, *needles: str) -> None:
    status_got, payload = status_payload
    assert status_got == status, payload
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert err["param"] == param
    for needle in needles:
        assert needle in err["message"], (needle, err["message"])


def still_serving(base: str) -> None:
    status, payload = post(base, "/completions", json.dumps({"prompt": "1", "max_tokens": 2, "seed": 0}).encode())
    assert status == 200 and len(payload["choices"]) == 1


# ---------------------------------------------------------------- bad requests to our server

CHAT = "/chat/completions"
USER = [{"role": "user", "content": "12+34="}]


@pytest.mark.parametrize("path, raw, status, param, needle", [
    ("/completions", b'{"prompt": "1", "n": ', 400, None, "the request body is not valid JSON"),
    (CHAT, b"[1, 2]", 400, None, "the request body must be a JSON object, got list"),
    (CHAT, b"\xff\xfe", 400, None, "the request body is not valid JSON"),
    (CHAT, json.dumps({"model": "gpt-4", "messages": USER}).encode(), 404, "model",
     "the model 'gpt-4' does not exist; this server serves 'tiny'"),
    (CHAT, json.dumps({"messages": USER, "n": 0}).encode(), 400, "n", "n must be an integer >= 1, got 0"),
    ("/completions", json.dumps({"prompt": "1", "max_tokens": -5}).encode(), 400, "max_tokens",
     "max_tokens must be an integer >= 1, got -5"),
    (CHAT, json.dumps({"messages": USER, "max_completion_tokens": 0}).encode(), 400, "max_completion_tokens",
     "max_completion_tokens must be an integer >= 1"),
    (CHAT, json.dumps({"model": NAME}).encode(), 400, "messages", "messages is required"),
    (CHAT, json.dumps({"messages": []}).encode(), 400, "messages", "messages must be a non-empty list"),
    (CHAT, json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(), 400, "messages[0].role",
     "messages[0].role must be one of system, developer, user, assistant, got 'robot'"),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": 42}]}).encode(), 400, "messages[0].content",
     "messages[0].content must be a string or a list of text parts"),
    (CHAT, json.dumps({"messages": [{"role": "system", "content": "be brief"}]}).encode(), 400, "messages",
     "the chat template rejected the messages"),
    (CHAT, json.dumps({"messages": USER, "continue_final_message": True}).encode(), 400,
     "continue_final_message", "needs a final assistant message"),
    (CHAT, json.dumps({"messages": USER, "stream": True}).encode(), 400, "stream", "stream=true is not supported"),
    (CHAT, json.dumps({"messages": USER, "tools": [{"type": "function"}]}).encode(), 400, "tools",
     "tools is not supported"),
    (CHAT, json.dumps({"messages": USER, "logprobs": 3}).encode(), 400, "logprobs", "logprobs must be true or false"),
    (CHAT, json.dumps({"messages": USER, "temperature": -1}).encode(), 400, "temperature", "temperature"),
    ("/embeddings", b"{}", 404, None, "no route POST /v1/embeddings"),
    # issue #30: types, Unicode, the server's limits and the model's context
    ("/completions", json.dumps({"prompt": "1", "stop": 5}).encode(), 400, "stop",
     "stop must be a string or a list of non-empty strings, got 5"),
    ("/completions", b'{"prompt": "1\\ud800"}', 400, "prompt", "not valid Unicode"),
    (CHAT, b'{"messages": [{"role": "user", "content": "\\udc00"}]}', 400, "messages", "not valid Unicode"),
    ("/completions", json.dumps({"prompt": "1", "n": 50000}).encode(), 400, "n",
     "n=50000 is over this server's limit of 64"),
    ("/completions", json.dumps({"prompt": ["1"] * 20, "n": 64}).encode(), 400, "n",
     "20 prompts x n=64 = 1280 sequences is over this server's limit of 1024"),
    ("/completions", json.dumps({"prompt": "1", "max_tokens": 10**13}).encode(), 400, "max_tokens",
     "max_tokens=10000000000000 is over this server's limit of 256"),
    ("/completions", json.dumps({"prompt": "1" * 300, "max_tokens": 4}).encode(), 400, "prompt",
     "prompt 0 has 300 tokens and max_tokens is 4: together more than the model's context of 256 tokens"),
    ("/completions", json.dumps({"prompt": "1" * 250, "max_tokens": 10}).encode(), 400, "max_tokens",
     "prompt 0 has 250 tokens and max_tokens is 10"),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": "1" * 300}]}).encode(), 400, "messages",
     "no room to answer"),
], ids=["invalid-json", "body-not-object", "body-not-utf8", "unknown-model", "n-0", "negative-max-tokens",
        "max-completion-tokens-0", "missing-messages", "empty-messages", "wrong-role", "content-not-text",
        "role-the-template-rejects", "continue-without-assistant", "stream", "tools", "logprobs-not-bool",
        "negative-temperature", "unknown-route", "stop-not-text", "lone-surrogate", "lone-surrogate-chat",
        "n-over-limit", "sequences-over-limit", "max-tokens-over-context", "prompt-over-context",
        "prompt-and-max-tokens-over-context", "chat-over-context"])
def test_bad_requests_get_an_openai_error_object(url, path, raw, status, param, needle):
    assert_error(post(url, path, raw), status, param, needle)
    still_serving(url)


def test_a_bad_content_length_is_refused(url):
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n{}")
        head, _, body = s.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert "Content-Length must be an integer" in json.loads(body)["error"]["message"]
    still_serving(url)


# ---------------------------------------------------------------- a server that misbehaves


class Junk(BaseHTTPRequestHandler):
    """Answers every path with what ``replies`` says: (status, body bytes, seconds to wait first)."""

    protocol_version = "HTTP/1.1"
    replies: dict = {}

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, data, wait = self.replies[self.path]
        time.sleep(wait)
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def junk():
    handler = type("J", (Junk,), {"replies": {}})
    server, base = serve(handler)
    yield handler.replies, base
    stop(server)


@pytest.mark.parametrize("endpoint, reply, error, needle", [
    ("completions", (200, b"<html>hello</html>", 0), MalformedResponseError, "did not return JSON: b'<html>"),
    ("chat", (200, b'{"id": 1}', 0), MalformedResponseError, "response has no 'choices' list"),
    ("chat", (200, b'{"choices": [{"text": "1", "finish_reason": "stop"}]}', 0), MalformedResponseError,
     "choice 0 has no 'message.content' string"),
    ("completions", (200, b'{"choices": [{"text": "1", "finish_reason": "stop", "logprobs": [1]}]}', 0),
     MalformedResponseError, "choice 0 is malformed (AttributeError"),
    ("completions", (200, b'{"choices": [{"text": "1", "finish_reason": "stop", "token_ids": ["x"]}]}', 0),
     MalformedResponseError, "choice 0 is malformed (ValueError"),
    ("completions", (200, b'{"choices": [{"text": "1", "finish_reason": "tired"}]}', 0), MalformedResponseError,
     "choice 0 has finish_reason 'tired'"),
    ("chat", (500, b'{"error": {"message": "CUDA out of memory"}}', 0), OpenAIServerError,
     "HTTP 500 from {url}: CUDA out of memory"),
    ("completions", (503, b"Service Unavailable", 0), OpenAIServerError, "HTTP 503 from {url}: Service Unavailable"),
    ("completions", (200, b"{}", 2.0), TimeoutError, "the OpenAI-compatible server at {url} gave no answer within 0.3 s"),
], ids=["not-json", "no-choices", "chat-without-message", "logprobs-a-list", "token-ids-not-ints",
        "unknown-finish-reason", "http-500", "http-503-text", "timeout"])
def test_a_misbehaving_server_gives_one_clear_error(junk, endpoint, reply, error, needle):
    replies, base = junk
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    replies[path] = reply
    eng = OpenAIEngine(base, "m", endpoint=endpoint, max_retries=1, timeout=0.3 if reply[2] else 30)
    with pytest.raises(error) as info:
        eng.generate(["1"], 1, P)
    message = str(info.value)
    assert "\n" not in message
    assert needle.format(url=base + path[3:]) in message
    assert base in message


def test_connection_refused_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    eng = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "m", endpoint="chat", max_retries=0)
    with pytest.raises(ConnectionError, match=rf"cannot reach the OpenAI-compatible server at "
                                              rf"http://127.0.0.1:{port}/v1/chat/completions \(1 attempt\)"):
        eng.generate(["1"], 1, P)


def test_a_server_that_does_not_speak_http():
    class Garbage(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(65536)
            self.request.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        with pytest.raises(ConnectionError) as info:
            OpenAIEngine(base, "m", max_retries=0).generate(["1"], 1, P)
        assert str(info.value) == (f"{base}/completions did not answer with valid HTTP (1 attempt): BadStatusLine: "
                                   "SSH-2.0-OpenSSH_9.6")
    finally:
        server.shutdown()
        server.server_close()


class Flaky(RolloutEngine):
    """An engine that fails once it has answered ``ok`` requests (a server whose GPU falls over)."""

    def __init__(self, inner, ok):
        self.inner, self.ok, self.calls = inner, ok, 0
        self.tokenizer, self.eos_token_ids = inner.tokenizer, inner.eos_token_ids

    def encode(self, prompts):
        return self.inner.encode(prompts)

    def _generate(self, prompts, counts, params, seed, progress):
        self.calls += 1
        if self.calls > self.ok:
            raise RuntimeError("CUDA error: device-side assert triggered")
        return self.inner._generate(prompts, counts, params, seed, progress)


def test_an_audit_over_a_failing_server_keeps_what_it_finished(engine, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    engine.tokenizer.save_pretrained(ckpt)  # the audit renders prompts with the checkpoint's tokenizer
    flaky = Flaky(engine, ok=2)  # chunk 0: two samples, one request each
    server, base = serve(flaky)
    out = tmp_path / "audit"
    argv = ["audit", "--backend", "openai", "--base-url", base, "--model-name", NAME, "--model", str(ckpt),
            "--task", "arithmetic", "--task-kwargs", '{"levels": ["add2"], "n_test": 4}', "--runs", "2",
            "--chunk-size", "2", "--max-new-tokens", "6", "--no-plots", "--quiet", "--out", str(out)]
    try:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        line = next(x for x in err.splitlines() if "HTTP 500" in x)
        assert f"{base}/completions" in line and "CUDA error: device-side assert triggered" in line
        assert len((out / "runs.jsonl").read_text().splitlines()) == 2 * 2  # chunk 0 is kept
        flaky.ok = 10**9  # the server recovers; the same command resumes
        assert main(argv) == 0
        assert len((out / "runs.jsonl").read_text().splitlines()) == 4 * 2
    finally:
        stop(server)


# ---------------------------------------------------------------- the command line's own misuse


@pytest.mark.parametrize("argv, needles", [
    (["trian"], ["rlcurate: error: unknown command 'trian' (did you mean 'train'?)", "strategies"]),
    (["--verbose"], ["rlcurate: error: unknown command '--verbose'", "see 'rlcurate --help'"]),
    (["replay"], ["unknown command 'replay' (it is an option: rlcurate runs --suite SUITE --replay STEPS)"]),
    (["summarize", "runs/a"], ["unknown command 'summarize' (it is an option: rlcurate audit --summarize DIR)"]),
    (["help", "audits"], ["unknown command 'audits' (did you mean 'audit'?)"]),
    (["strategies", "insigt"], ["rlcurate strategies: error: unknown strategy 'insigt' (did you mean 'insight'?)"]),
    (["strategies", "insight+ada_seq_balanced+dapo"], ["a composition has two parts, selector+sampler"]),
    (["strategies", "--verbose"], ["rlcurate strategies: error: unrecognized arguments: --verbose",
                                   "see 'rlcurate strategies --help'"]),
    (["serve", "--port", "eighty"], ["rlcurate serve: error: argument --port: invalid int value: 'eighty'"]),
    (["train", "--sett", "steps=1"], ["rlcurate train: error: unrecognized arguments: --sett"]),
    (["audit", "--endpoint", "responses"], ["rlcurate audit: error: argument --endpoint: invalid choice: "
                                            "'responses'"]),
    (["audit", "--endpoint", "chat", "--model", "data/tiny/spread", "--out", "/nonexistent/x"],
     ["endpoint 'chat' needs backend 'openai'"]),
], ids=["misspelt-command", "option-for-command", "replay-for-runs-option", "summarize-for-audit-option",
         "help-misspelt", "unknown-strategy", "three-part-composition",
        "strategies-unknown-option", "serve-port-not-int", "train-misspelt-option", "audit-unknown-endpoint",
        "audit-chat-with-local-backend"])
def test_cli_misuse_is_one_line(argv, needles, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors exit from the parser
        rc = exc.code
    assert rc == 2
    one_line_error(capsys.readouterr().err, *needles)


def test_strategies_help_with_a_name_describes_that_strategy(capsys):
    # issue #14: `rlcurate strategies --help NAME` gives the strategy's documentation and options
    assert main(["strategies", "--help", "insight"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("insight\n") and "options (strategy_kwargs)" in out and "candidates = " in out
    with pytest.raises(SystemExit) as info:
        main(["strategies", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: rlcurate strategies [-h] [--check] [--options YAML] [NAME ...]")


def test_a_closed_pipe_is_no_traceback():
    proc = subprocess.run(f"{sys.executable} -m rlcurate strategies | head -n 1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.startswith("curation strategies")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


class Slow(Flaky):
    def _generate(self, prompts, counts, params, seed, progress):
        time.sleep(1.0)
        return self.inner._generate(prompts, counts, params, seed, progress)


def test_a_client_that_gives_up_is_no_traceback_on_the_server(engine, capfd):
    server, base = serve(Slow(engine, ok=10**9))
    try:
        with pytest.raises(TimeoutError, match="gave no answer within 0.2 s"):
            OpenAIEngine(base, NAME, timeout=0.2, max_retries=0).generate(["1"], 1, P)
        still_serving(base)  # waits for the slow request, whose answer finds the client gone
        time.sleep(0.2)
    finally:
        stop(server)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("case", ["port-range", "port-in-use", "bad-host"])
def test_serve_refuses_an_address_it_cannot_listen_on_before_loading(capsys, case):
    """`serve --port 99999`, a port another process holds and a host that does not resolve: one line each,
    before the model loads (issue #30; before: a traceback after the model had loaded)."""
    model = str(Path(__file__).resolve().parents[1] / "data" / "tiny" / "spread")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        argv, needle = {"port-range": (["--port", "99999"], "a port is a number from 0 to 65535"),
                        "port-in-use": (["--port", str(holder.getsockname()[1])], "another process holds the port"),
                        "bad-host": (["--host", "nosuchhost.invalid"], "not an address this machine can listen on")}[case]
        assert main(["serve", "--model", model, *argv]) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- turns, timeout, disconnect (issue #30)

def test_turns_are_first_come_first_served_and_a_wait_can_run_out():
    """`Turns`: a second request waits for the first; one whose wait runs out holds nothing; `pass_turn` hands the
    model to the request queued behind and takes it back after."""
    from rlcurate.rollout.server import Turns

    turns, order = Turns(), []
    assert turns.acquire(0)
    assert not turns.acquire(0.05)  # queued behind the holder, gave up: holds nothing

    def second():
        assert turns.acquire(5)
        order.append("second")
        turns.release()

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.1)
    order.append("first, before passing")
    assert turns.pass_turn(5)  # the second request runs, then hands the model back
    order.append("first, after passing")
    t.join()
    turns.release()
    assert order == ["first, before passing", "second", "first, after passing"]
    assert turns.acquire(0) and turns.pass_turn(0)  # nobody waits: passing keeps the turn
    turns.release()


@pytest.fixture(scope="module")
def endless():
    """The tiny model with no end-of-sequence token: every completion runs to max_tokens."""
    return TransformersEngine(tiny_model(), char_tokenizer(), eos_token_ids=[])


LARGE = {"prompt": ["1+1="] * 16, "n": 64, "max_tokens": 200, "seed": 0}


def test_a_small_request_is_answered_while_a_large_one_generates_and_a_client_that_leaves_stops_its_generation(
        endless, caplog):
    """Issue #30: a request queued behind a large one gets the model between the large one's decode steps; the large
    request's client closes its connection, and the server stops that generation (before: a client that
    disconnected kept its generation running, and every other request waited for all of it)."""
    caplog.set_level(logging.INFO, logger="rlcurate.rollout.server")
    server, base = serve(endless)
    try:
        port = server.server_address[1]
        large = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        large.request("POST", "/v1/completions", body=json.dumps(LARGE), headers={"Content-Type": "application/json"})
        time.sleep(0.3)  # the large request has the model
        status, payload = post(base, "/completions", json.dumps({"prompt": "2+2=", "max_tokens": 3, "seed": 1}).encode())
        assert status == 200 and len(payload["choices"][0]["text"]) > 0
        assert not select.select([large.sock], [], [], 0)[0], "the large request was answered first"
        large.sock.close()
        for _ in range(100):
            if any("went away" in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.05)
        assert any("went away: its generation stopped" in r.getMessage() for r in caplog.records)
        still_serving(base)
    finally:
        stop(server)


def test_a_request_past_the_timeout_is_stopped_and_answered_504(endless):
    server = make_server(endless, port=0, model_name=NAME, limits=ServerLimits(request_timeout=0.3))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        t0 = time.monotonic()
        status, payload = post(base, "/completions", json.dumps(LARGE).encode())
        assert status == 504 and "request timeout of 0.3 s" in payload["error"]["message"]
        assert time.monotonic() - t0 < 5
        still_serving(base)
    finally:
        stop(server)


def test_a_request_that_waits_past_the_timeout_is_answered_503(engine):
    """An engine that cannot pause (here one that sleeps a second) holds the model; a request queued behind it
    for longer than the timeout is answered 503 with Retry-After, not left hanging."""
    server = make_server(Slow(engine, ok=10**9), port=0, model_name=NAME, limits=ServerLimits(request_timeout=0.4))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        first = threading.Thread(target=post, args=(base, "/completions", json.dumps({"prompt": "1", "max_tokens": 2}).encode()))
        first.start()
        time.sleep(0.1)
        status, payload = post(base, "/completions", json.dumps({"prompt": "1", "max_tokens": 2}).encode())
        assert status == 503 and "waited its whole 0.4 s" in payload["error"]["message"]
        first.join()
    finally:
        stop(server)


def test_serve_refuses_a_negative_request_timeout(capsys):
    model = str(Path(__file__).resolve().parents[1] / "data" / "tiny" / "spread")
    assert main(["serve", "--model", model, "--port", "0", "--request-timeout", "-1"]) == 2
    one_line_error(capsys.readouterr().err, "--request-timeout must be a number of seconds >= 0")


def test_a_504_is_not_retried(junk):
    """`rlcurate serve` answers 504 when a generation runs past its request timeout: the same request would meet
    it again, so the client reports it at once instead of retrying (a 503, busy, is retried)."""
    replies, base = junk
    calls = []
    replies["/v1/completions"] = (504, json.dumps({"error": {"message": "the generation ran past this server's request "
                                                                       "timeout of 1 s", "type": "timeout"}}).encode(), 0)
    original = Junk.do_POST

    def counted(self):
        calls.append(self.path)
        return original(self)

    eng = OpenAIEngine(base, "m", max_retries=2)
    with mock.patch.object(Junk, "do_POST", counted):
        with pytest.raises(OpenAIServerError, match="HTTP 504 from .*request timeout of 1 s"):
            eng.generate(["1"], 1, P)
    assert calls == ["/v1/completions"]
