"""A minimal OpenAI-compatible server for any :class:`TransformersEngine` (chapter 4).

Serve a checkpoint (the tiny model, a Hub checkpoint on a GPU box) so that an audit can run against
it over HTTP with :class:`~rlcurate.rollout.openai_api.OpenAIEngine`, exactly as it would against
``vllm serve``, and so that any OpenAI client (the official ``openai`` package, a chat UI) can talk
to it::

    rlcurate serve --model data/tiny/spread --port 8000

Endpoints: ``GET /v1/models``, ``GET /health``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (no streaming, no echo, no tools).

``/v1/completions`` accepts ``prompt`` (a string, a list of strings, a list of token ids or a list of
lists), ``n``, ``temperature``, ``top_p``, ``max_tokens`` (default 16, as in the OpenAI API),
``stop``, ``seed``, ``logprobs``, and the vLLM extensions ``top_k`` (0 or -1: none),
``include_stop_str_in_output`` (default false, as in vLLM: the stop string is cut from ``text``),
``return_token_ids`` and ``return_tokens_as_token_ids``. Choice ``k`` of a request is sample
``k % n`` of prompt ``k // n``.

``/v1/chat/completions`` accepts ``messages`` (roles ``system``, ``developer``, ``user``,
``assistant``; string contents or text parts), rendered with the checkpoint's chat template
(``tokenizer.apply_chat_template``), the same sampling fields, ``max_tokens`` or
``max_completion_tokens`` (default: the rest of the model's context, as in vLLM), ``logprobs``
(true/false) and ``top_logprobs``, and the vLLM extensions ``add_generation_prompt`` (default true)
and ``continue_final_message`` (continue a final assistant message: a prefill). The answer is the
OpenAI ``chat.completion`` object: ``choices[k].message.content``, ``finish_reason``, ``logprobs``
and ``usage``.

Penalties other than neutral ones are refused rather than ignored. ``logprobs`` follow
:mod:`rlcurate.rollout.base`: ``log softmax(logits / T)`` of each sampled token; top log-probs hold
only the sampled token. Without ``seed`` a random one is drawn. A bad request gets an OpenAI-style
error object (``{"error": {"message", "type", "param", "code"}}``) with status 400 (404 for an
unknown model or route): every field is checked (type, range, valid Unicode), a request over the server's
limits (:class:`ServerLimits`: samples per prompt, sequences per request, new tokens) is refused, and so is a
prompt that does not leave ``max_tokens`` of the model's context (never shortened silently).

Requests take turns on the model, first come first served (:class:`Turns`; the engine batches within a request).
A request that has generated for ``TURN_SECONDS`` lets the requests queued behind it have the model at the engine's
next pause point (between decode steps of the dynamic decode loop, between batches of the fixed-shape one) and then
goes on, so a small request is not held for the whole length of a large one; each paused request keeps its batch's
KV cache meanwhile. Each request has ``--request-timeout`` seconds
from its arrival: one still queued then is answered 503 (busy, with ``Retry-After``), one still generating is
stopped and answered 504. A client that disconnects stops its generation at the next decode step.
"""

from __future__ import annotations

import json
import logging
import secrets
import select
import socket
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .base import SamplingParams

log = logging.getLogger(__name__)

_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0}
_UNSUPPORTED_CHAT = ("tools", "functions", "response_format", "audio", "prediction")
MAX_BODY_BYTES = 64 * 2**20
TURN_SECONDS = 0.25
"""how long a request generates before it lets the requests queued behind it have the model (:class:`Turns`)"""


class RequestError(ValueError):
    """A bad request to the server (chapter 4): answered with HTTP 400 (or ``status``) and an
    OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def _prompts_of(prompt) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(t, int) for t in p))
               for p in prompt):
            return list(prompt)
    raise RequestError("prompt must be a string, a list of strings, a list of token ids or a list of "
                       "lists of token ids", param="prompt")


def _int_field(body, name, default, minimum):
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise RequestError(f"{name} must be an integer >= {minimum}, got {v!r}", param=name)
    return v


def _sampling(body: dict, max_tokens: int) -> dict:
    """The fields ``/v1/completions`` and ``/v1/chat/completions`` share, checked (chapter 4)."""
    if body.get("stream"):
        raise RequestError("stream=true is not supported by this server", param="stream")
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise RequestError("best_of is not supported by this server", param="best_of")
    for name, neutral in _NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise RequestError(f"{name}={body[name]!r} is not supported; only {neutral} is", param=name)
    if body.get("logit_bias"):
        raise RequestError("logit_bias is not supported by this server", param="logit_bias")
    n = _int_field(body, "n", 1, 1)
    top_k = body.get("top_k", 0)
    if top_k is None or top_k == -1:
        top_k = 0
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(x, str) and x for x in stop))):
        raise RequestError(f"stop must be a string or a list of non-empty strings, got {stop!r}", param="stop")
    try:
        params = SamplingParams(
            temperature=1.0 if body.get("temperature") is None else body["temperature"],
            top_p=1.0 if body.get("top_p") is None else body["top_p"],
            top_k=top_k, max_new_tokens=max_tokens,
            stop=(stop,) if isinstance(stop, str) else tuple(stop))
    except ValueError as exc:
        raise RequestError(str(exc), param=str(exc).split()[0]) from None
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise RequestError(f"seed must be a non-negative integer, got {seed!r}", param="seed")
    return dict(n=n, params=params, seed=seed,
                include_stop=bool(body.get("include_stop_str_in_output", False)),
                return_token_ids=bool(body.get("return_token_ids", False)),
                tokens_as_ids=bool(body.get("return_tokens_as_token_ids", False)))


def _check_body(body) -> None:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")


def _check_unicode(value, param: str | None = None) -> None:
    """Refuse a string JSON can carry but UTF-8 cannot (a lone surrogate such as "\\ud800"), naming the field."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"{param or 'the body'} holds text that is not valid Unicode ({exc.reason} at "
                               f"character {exc.start})", param=param) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_unicode(k, param)
            _check_unicode(v, param or str(k))
    elif isinstance(value, list):
        for v in value:
            _check_unicode(v, param)


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for (``rlcurate serve --max-n --max-sequences --max-tokens``): a request over a
    limit is answered 400 naming it, so that no client can hold the one model for minutes."""

    max_n: int = 64
    max_sequences: int = 1024
    """prompts x n in one request"""
    max_tokens: int | None = None
    """completion tokens per sequence (None: the model's context)"""
    request_timeout: float | None = 300.0
    """seconds from a request's arrival to its answer, queueing included (None: no limit)"""


class Turns:
    """The model, one request at a time, first come first served (chapter 4's server).

    ``acquire`` queues for the turn; ``pass_turn`` hands it to the next request waiting (if any) and queues again
    behind the others, so a request that generates in several batches lets those behind it in between. Both give
    up after ``timeout`` seconds and return False (the caller then holds no turn)."""

    def __init__(self):
        self._mutex = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._busy = False

    def _wait(self, ticket: threading.Event, timeout: float | None) -> bool:
        if ticket.wait(timeout):
            return True
        with self._mutex:
            if ticket.is_set():  # handed over as the wait ran out
                return True
            self._waiting.remove(ticket)
            return False

    def acquire(self, timeout: float | None = None) -> bool:
        with self._mutex:
            if not self._busy:
                self._busy = True
                return True
            ticket = threading.Event()
            self._waiting.append(ticket)
        return self._wait(ticket, timeout)

    def release(self) -> None:
        with self._mutex:
            if self._waiting:
                self._waiting.popleft().set()  # the turn passes on; the model stays busy
            else:
                self._busy = False

    def pass_turn(self, timeout: float | None = None) -> bool:
        with self._mutex:
            if not self._waiting:
                return True
            ticket = threading.Event()
            self._waiting.append(ticket)
            self._waiting.popleft().set()
        return self._wait(ticket, timeout)


class _Stopped(Exception):
    """A generation stopped by its request's hook: the client went away or the request ran out of time."""

    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status = status  # None: nobody to answer


def _client_gone(sock) -> bool:
    """Whether the client closed its end: the socket reads as ready with nothing to read."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def check_limits(engine, req: dict, limits: ServerLimits) -> None:
    """A parsed request against ``limits`` and the model's context: prompt tokens + ``max_tokens`` must fit in
    it (the request is refused, never shortened). The prompts are encoded here once: ``req["prompts"]`` becomes
    their token ids, which the engine takes as they are."""
    n, prompts, m = req["n"], req["prompts"], req["params"].max_new_tokens
    if n > limits.max_n:
        raise RequestError(f"n={n} is over this server's limit of {limits.max_n} (rlcurate serve --max-n)", param="n")
    if n * len(prompts) > limits.max_sequences:
        raise RequestError(f"{len(prompts)} prompts x n={n} = {n * len(prompts)} sequences is over this server's "
                           f"limit of {limits.max_sequences} (rlcurate serve --max-sequences)", param="n")
    context = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
    cap = limits.max_tokens or context
    if cap and m > cap:
        raise RequestError(f"max_tokens={m} is over this server's limit of {cap}", param="max_tokens")
    if hasattr(engine, "encode"):
        req["prompts"] = engine.encode(prompts)
    if isinstance(context, int) and hasattr(engine, "encode"):
        for i, ids in enumerate(req["prompts"]):
            if len(ids) + m > context:
                raise RequestError(f"prompt {i} has {len(ids)} tokens and max_tokens is {m}: together more than the "
                                   f"model's context of {context} tokens", param="max_tokens" if len(ids) < context
                                   else "prompt")


def parse_request(body: dict) -> dict:
    """Check a ``/v1/completions`` body and turn it into engine arguments (chapter 4); raises
    :class:`RequestError` naming the bad field."""
    _check_body(body)
    if body.get("echo"):
        raise RequestError("echo=true is not supported by this server", param="echo")
    prompts = _prompts_of(body.get("prompt"))
    req = _sampling(body, _int_field(body, "max_tokens", 16, 1))
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise RequestError(f"logprobs must be a non-negative integer, got {logprobs!r}", param="logprobs")
    return dict(req, prompts=prompts, logprobs=logprobs)


def render_messages(tokenizer, messages, add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> str:
    """The prompt text of a chat request (chapter 4): ``messages`` through the tokenizer's chat
    template, ending in the assistant's turn (``add_generation_prompt``) or inside a final assistant
    message that the model continues (``continue_final_message``, a prefill). Raises
    :class:`RequestError` when the template is missing or rejects the messages."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("this model's tokenizer has no chat template; use /v1/completions with a "
                           "rendered prompt")
    if continue_final_message and messages[-1]["role"] != "assistant":
        raise RequestError("continue_final_message=true needs a final assistant message to continue",
                           param="continue_final_message")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message)
    except Exception as exc:  # jinja's TemplateError (raise_exception in a template) and kin
        raise RequestError(f"the chat template rejected the messages: {exc}", param="messages") from None


def parse_chat_request(body: dict, engine) -> dict:
    """Check a ``/v1/chat/completions`` body and turn it into engine arguments (chapter 4): the
    messages are rendered by :func:`render_messages` with ``engine.tokenizer``; raises
    :class:`RequestError` naming the bad field."""
    from .openai_api import check_conversation

    _check_body(body)
    for name in _UNSUPPORTED_CHAT:
        if body.get(name):
            raise RequestError(f"{name} is not supported by this server", param=name)
    if body.get("tool_choice") not in (None, "none"):
        raise RequestError("tool_choice is not supported by this server", param="tool_choice")
    if "messages" not in body:
        raise RequestError("messages is required: a list of {'role': ..., 'content': ...} objects",
                           param="messages")
    try:
        messages = check_conversation(body["messages"])
    except ValueError as exc:
        raise RequestError(str(exc), param=str(exc).split()[0]) from None
    continue_final = body.get("continue_final_message", False)
    add_generation = body.get("add_generation_prompt", not continue_final)
    for name, v in (("continue_final_message", continue_final), ("add_generation_prompt", add_generation)):
        if not isinstance(v, bool):
            raise RequestError(f"{name} must be true or false, got {v!r}", param=name)
    if continue_final and add_generation:
        raise RequestError("add_generation_prompt and continue_final_message cannot both be true",
                           param="add_generation_prompt")
    text = render_messages(engine.tokenizer, messages, add_generation, continue_final)
    n_prompt = len(engine.encode([text])[0]) if hasattr(engine, "encode") else 0
    context = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if isinstance(context, int) and n_prompt >= context:
        raise RequestError(f"the rendered messages have {n_prompt} tokens, the model's context {context}: no room "
                           f"to answer", param="messages")
    room = context - n_prompt if isinstance(context, int) else 16
    req = _sampling(body, _int_field(body, name, room, 1))
    logprobs = body.get("logprobs", False)
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestError(f"logprobs must be true or false, got {logprobs!r}", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise RequestError(f"top_logprobs must be an integer in 0..20, got {top!r}", param="top_logprobs")
    if top and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    return dict(req, prompts=[text], logprobs=bool(logprobs))


def _samples(engine, req: dict) -> tuple[list[dict], int, int]:
    """Generate a parsed request: one dict per choice (text with the stop-string convention applied,
    finish and stop reasons, token ids, log-probs, prompt ids), and the prompt and completion token
    counts."""
    params: SamplingParams = req["params"]
    hook = req.get("hook") if getattr(engine, "accepts_hook", False) else None  # others run to the end
    groups = engine.generate(req["prompts"], req["n"], params, seed=req["seed"], hook=hook)
    out, n_prompt, n_completion = [], 0, 0
    for group in groups:
        n_prompt += len(group[0].prompt_token_ids)
        for c in group:
            n_completion += len(c.token_ids)
            text, stop_reason = c.text, None
            if c.finish_reason == "stop":
                hit = [s for s in params.stop if text.endswith(s)]
                if hit and (not c.token_ids or c.token_ids[-1] not in engine.eos_token_ids):
                    stop_reason = max(hit, key=len)
                    if not req["include_stop"]:
                        text = text[: -len(stop_reason)]
                elif c.token_ids:
                    stop_reason = c.token_ids[-1]
            out.append({"text": text, "finish_reason": c.finish_reason, "stop_reason": stop_reason,
                        "token_ids": list(c.token_ids), "logprobs": list(c.logprobs),
                        "prompt_token_ids": list(c.prompt_token_ids)})
    return out, n_prompt, n_completion


def _usage(n_prompt: int, n_completion: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


def _pieces(engine, req: dict, token_ids: list[int]) -> list[str]:
    tok = engine.tokenizer
    return [f"token_id:{t}" for t in token_ids] if req["tokens_as_ids"] else [tok.decode([t]) for t in token_ids]


def completion_response(engine, model_name: str, req: dict) -> dict:
    """Run one parsed ``/v1/completions`` request on ``engine`` and build the OpenAI
    ``text_completion`` response (chapter 4)."""
    samples, n_prompt, n_completion = _samples(engine, req)
    choices = []
    for k, s in enumerate(samples):
        choice = {"index": k, "text": s["text"], "finish_reason": s["finish_reason"],
                  "stop_reason": s["stop_reason"], "logprobs": None}
        if req["logprobs"] is not None:
            pieces = _pieces(engine, req, s["token_ids"])
            offsets, pos = [], 0
            for t in s["token_ids"]:
                offsets.append(pos)
                pos += len(engine.tokenizer.decode([t]))
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": s["logprobs"],
                                  "top_logprobs": [{p: lp} for p, lp in zip(pieces, s["logprobs"])],
                                  "text_offset": offsets}
        if req["return_token_ids"]:
            choice["token_ids"] = s["token_ids"]
            choice["prompt_token_ids"] = s["prompt_token_ids"]
        choices.append(choice)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices, "usage": _usage(n_prompt, n_completion)}


def chat_response(engine, model_name: str, req: dict) -> dict:
    """Run one parsed ``/v1/chat/completions`` request on ``engine`` and build the OpenAI
    ``chat.completion`` response (chapter 4)."""
    samples, n_prompt, n_completion = _samples(engine, req)
    choices = []
    for k, s in enumerate(samples):
        choice = {"index": k, "message": {"role": "assistant", "content": s["text"]},
                  "finish_reason": s["finish_reason"], "stop_reason": s["stop_reason"], "logprobs": None}
        if req["logprobs"]:
            entries = []
            for piece, lp in zip(_pieces(engine, req, s["token_ids"]), s["logprobs"]):
                raw = list(piece.encode())
                entries.append({"token": piece, "logprob": lp, "bytes": raw,
                                "top_logprobs": [{"token": piece, "logprob": lp, "bytes": raw}]})
            choice["logprobs"] = {"content": entries}
        if req["return_token_ids"]:
            choice["token_ids"] = s["token_ids"]
        choices.append(choice)
    payload = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
               "model": model_name, "choices": choices, "usage": _usage(n_prompt, n_completion)}
    if req["return_token_ids"]:
        payload["prompt_token_ids"] = samples[0]["prompt_token_ids"] if samples else []
    return payload


def make_server(engine, host: str = "127.0.0.1", port: int = 8000,
                model_name: str = "rlcurate", limits: ServerLimits | None = None) -> ThreadingHTTPServer:
    """An HTTP server (not yet started: call ``serve_forever``) that serves ``engine`` (chapter 4).

    ``port=0`` picks a free port; read it back from ``server.server_address[1]``.
    """
    turns = Turns()
    limits = limits or ServerLimits()
    timeout = limits.request_timeout
    routes = {"/v1/completions": (parse_request, completion_response),
              "/v1/chat/completions": (lambda body: parse_chat_request(body, engine), chat_response)}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log.debug("%s - %s", self.address_string(), fmt % args)

        def _send(self, status: int, payload: dict, headers: dict | None = None):
            data = json.dumps(payload).encode()
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
            kind = {404: "not_found_error", 503: "server_busy", 504: "timeout"}.get(
                status, "invalid_request_error" if status < 500 else "internal_error")
            self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": status}}, headers)

        def _generate(self, parse, respond, body: dict, arrived: float) -> dict:
            """Parse, check and answer ``body`` on the model in this request's turns (see :class:`Turns`)."""
            deadline = None if timeout is None else arrived + timeout
            left = lambda: None if deadline is None else max(deadline - time.monotonic(), 0.0)  # noqa: E731
            if not turns.acquire(left()):
                raise _Stopped(503, f"the server is busy: this request waited its whole {timeout:g} s (rlcurate "
                                    f"serve --request-timeout) for the model; try again")
            holding, turn_began = True, time.monotonic()

            def hook(can_pause: bool) -> None:
                nonlocal holding, turn_began
                if _client_gone(self.connection):
                    raise _Stopped(None, "the client went away")
                if deadline is not None and time.monotonic() > deadline:
                    raise _Stopped(504, f"the generation ran past this server's request timeout of {timeout:g} s "
                                        f"(rlcurate serve --request-timeout); ask for fewer sequences or tokens")
                if can_pause and time.monotonic() - turn_began >= TURN_SECONDS:
                    if not turns.pass_turn(left()):
                        holding = False
                        raise _Stopped(504, f"the request ran past this server's request timeout of {timeout:g} s "
                                            f"(rlcurate serve --request-timeout) while other requests were served")
                    turn_began = time.monotonic()

            try:
                req = parse(body)
                check_limits(engine, req, limits)
                return respond(engine, model_name, {**req, "hook": hook})
            finally:
                if holding:
                    turns.release()

        def do_GET(self):
            path = self.path.split("?")[0].rstrip("/")
            if path == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "rlcurate"}]})
            elif path == "/health":
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route GET {self.path}; this server has /v1/models and /health")

        def do_POST(self):
            arrived = time.monotonic()
            path = self.path.split("?")[0].rstrip("/")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True  # the body cannot be skipped safely
                self._error(400, f"Content-Length must be an integer in 0..{MAX_BODY_BYTES}, got "
                                 f"{self.headers.get('Content-Length')!r}")
                return
            raw = self.rfile.read(length) if length else b""
            if path not in routes:
                self._error(404, f"no route POST {self.path}; this server has {' and '.join(routes)}")
                return
            parse, respond = routes[path]
            try:
                try:
                    body = json.loads(raw or b"null")
                except ValueError as exc:  # also a body that is not UTF-8
                    raise RequestError(f"the request body is not valid JSON: {exc}") from None
                _check_body(body)
                _check_unicode(body)
                if body.get("model") not in (None, model_name):
                    raise RequestError(f"the model {body['model']!r} does not exist; this server serves "
                                       f"{model_name!r}", status=404, param="model")
                payload = self._generate(parse, respond, body, arrived)
            except _Stopped as exc:
                if exc.status is None:
                    log.info("client %s went away: its generation stopped", self.address_string())
                    self.close_connection = True
                else:
                    self._error(exc.status, str(exc), headers={"Retry-After": "1"} if exc.status == 503 else None)
            except RequestError as exc:
                self._error(exc.status, str(exc), exc.param)
            except ValueError as exc:  # the engine's own input checks (e.g. a token id out of range)
                self._error(400, str(exc))
            except Exception as exc:  # report, keep serving
                log.exception("request failed")
                self._error(500, f"{type(exc).__name__}: {exc}")
            else:
                self._send(200, payload)

    return _Server((host, port), Handler)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: socketserver's 5 resets the sixth client that connects at once

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # the client went away (it timed out, it closed): no answer to send
            log.info("client %s went away before the answer: %s", client_address, exc)
            return
        super().handle_error(request, client_address)


def check_address(host: str, port: int) -> None:
    """Refuse, in one line, a port outside 0-65535, a host that does not resolve and an address already in use,
    by binding it once before anything expensive starts."""
    import socket

    from rlcurate.errors import UserError

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: a port is a number from 0 to 65535 (0 picks a free one)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r}: not an address this machine can listen on ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds (allow_reuse_address)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UserError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
                            f"{'another process holds the port: pick another, or --port 0 for a free one' if exc.errno == 98 else 'pick another address'}") from None


def main(argv=None) -> None:
    """Command line (chapter 4): ``rlcurate serve --model PATH [--port P]``."""
    from rlcurate._help import ArgumentParser, HelpFormatter, wrap

    ap = ArgumentParser(
        prog="rlcurate serve", formatter_class=HelpFormatter,
        description=wrap("Serve a checkpoint over an OpenAI-compatible HTTP API (chapter 4): GET /v1/models and "
                         "/health, POST /v1/completions and /v1/chat/completions (no streaming). An audit "
                         "reaches it with 'rlcurate audit --backend openai --base-url http://HOST:PORT/v1'."),
        epilog="example:\n  rlcurate serve --model data/tiny/spread --port 8000 --served-model-name tiny")
    ap.add_argument("--model", required=True, help="checkpoint directory or Hub id (loaded with AutoModelForCausalLM)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    ap.add_argument("--served-model-name", default=None, help="name in /v1/models (default: --model)")
    ap.add_argument("--token-budget", type=int, default=16384, help="tokens per generation batch")
    ap.add_argument("--device", default=None, help="e.g. cuda; default: where the model loads (CPU)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights' dtype")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--max-n", type=int, default=ServerLimits.max_n, help="most samples per prompt in one request")
    ap.add_argument("--max-sequences", type=int, default=ServerLimits.max_sequences,
                    help="most prompts x n in one request")
    ap.add_argument("--max-tokens", type=int, default=None, help="most new tokens per sequence (default: the context)")
    ap.add_argument("--request-timeout", type=float, default=ServerLimits.request_timeout,
                    help="seconds from a request's arrival to its answer, queueing included (0: no limit); a request "
                         "still queued then is answered 503, one still generating is stopped and answered 504")
    args = ap.parse_args(argv)
    from rlcurate.errors import UserError

    for flag, v in (("--max-n", args.max_n), ("--max-sequences", args.max_sequences), ("--max-tokens", args.max_tokens),
                    ("--token-budget", args.token_budget), ("--threads", args.threads)):
        if v is not None and v < 1:
            raise UserError(f"{flag} must be a whole number >= 1, got {v}")
    if not (args.request_timeout >= 0 and args.request_timeout < float("inf")):
        raise UserError(f"--request-timeout must be a number of seconds >= 0 (0: no limit), got {args.request_timeout}")
    from rlcurate.models.hf import check_model_source

    check_model_source(args.model, flag="--model")  # a missing path: one line (rlcurate.errors), not a traceback
    check_address(args.host, args.port)  # before the model loads, which can take minutes

    import torch

    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError:
            raise UserError(f"--device {args.device!r} is not a device (e.g. cpu, cuda, cuda:1)") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {args.device}: CUDA is not available on this machine")

    from .hf import TransformersEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    engine = TransformersEngine.from_pretrained(args.model, dtype=getattr(torch, args.dtype),
                                                device=args.device, token_budget=args.token_budget)
    name = args.served_model_name or args.model
    server = make_server(engine, args.host, args.port, name,
                         ServerLimits(args.max_n, args.max_sequences, args.max_tokens, args.request_timeout or None))
    host, port = server.server_address[:2]
    limit = f"{args.request_timeout:g} s" if args.request_timeout else "none"
    print(f"rlcurate.rollout.server: serving {name!r} (request timeout {limit}) on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":  # through the command line, so that a user's mistake is one line
    from rlcurate.cli import main as _cli

    raise SystemExit(_cli(["serve", *sys.argv[1:]]))
