"""A minimal OpenAI-compatible server for any :class:`TransformersEngine` (chapter 4).

Serve a checkpoint (the tiny model, a Hub checkpoint on a GPU box) so that an audit can run against
it over HTTP with :class:`~rlcurate.rollout.openai_api.OpenAIEngine`, exactly as it would against
``vllm serve``::

    python -m rlcurate.rollout.server --model data/tiny/ckpt --port 8000

Endpoints: ``GET /v1/models``, ``GET /health`` and ``POST /v1/completions`` (no streaming, no echo).
``/v1/completions`` accepts ``prompt`` (a string, a list of strings, a list of token ids or a list of
lists), ``n``, ``temperature``, ``top_p``, ``max_tokens`` (default 16, as in the OpenAI API),
``stop``, ``seed``, ``logprobs``, and the vLLM extensions ``top_k`` (0 or -1: none),
``include_stop_str_in_output`` (default false, as in vLLM: the stop string is cut from ``text``),
``return_token_ids`` and ``return_tokens_as_token_ids``. Penalties other than neutral ones are
refused rather than ignored. ``logprobs`` follow :mod:`rlcurate.rollout.base`:
``log softmax(logits / T)`` of each sampled token; ``top_logprobs`` holds only the sampled token.
Choice ``k`` of a request is sample ``k % n`` of prompt ``k // n``; without ``seed`` a random one is
drawn. Requests are served one at a time (the engine batches within a request).
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .base import SamplingParams

log = logging.getLogger(__name__)

_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0}


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


def parse_request(body: dict) -> dict:
    """Check a ``/v1/completions`` body and turn it into engine arguments (chapter 4); raises
    :class:`RequestError` naming the bad field."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for flag in ("stream", "echo"):
        if body.get(flag):
            raise RequestError(f"{flag}=true is not supported by this server", param=flag)
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise RequestError("best_of is not supported by this server", param="best_of")
    for name, neutral in _NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise RequestError(f"{name}={body[name]!r} is not supported; only {neutral} is", param=name)
    if body.get("logit_bias"):
        raise RequestError("logit_bias is not supported by this server", param="logit_bias")
    prompts = _prompts_of(body.get("prompt"))
    n = _int_field(body, "n", 1, 1)
    top_k = body.get("top_k", 0)
    if top_k is None or top_k == -1:
        top_k = 0
    stop = body.get("stop") or ()
    try:
        params = SamplingParams(
            temperature=1.0 if body.get("temperature") is None else body["temperature"],
            top_p=1.0 if body.get("top_p") is None else body["top_p"],
            top_k=top_k, max_new_tokens=_int_field(body, "max_tokens", 16, 1),
            stop=(stop,) if isinstance(stop, str) else tuple(stop))
    except ValueError as exc:
        raise RequestError(str(exc), param=str(exc).split()[0]) from None
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise RequestError(f"seed must be a non-negative integer, got {seed!r}", param="seed")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise RequestError(f"logprobs must be a non-negative integer, got {logprobs!r}", param="logprobs")
    return dict(prompts=prompts, n=n, params=params, seed=seed, logprobs=logprobs,
                include_stop=bool(body.get("include_stop_str_in_output", False)),
                return_token_ids=bool(body.get("return_token_ids", False)),
                tokens_as_ids=bool(body.get("return_tokens_as_token_ids", False)))


def completion_response(engine, model_name: str, req: dict) -> dict:
    """Run one parsed request on ``engine`` and build the OpenAI ``text_completion`` response (chapter 4)."""
    params: SamplingParams = req["params"]
    groups = engine.generate(req["prompts"], req["n"], params, seed=req["seed"])
    tok = engine.tokenizer
    choices, n_prompt, n_completion = [], 0, 0
    for group in groups:
        n_prompt += len(group[0].prompt_token_ids)
        for c in group:
            n_completion += len(c.token_ids)
            text = c.text
            stop_reason = None
            if c.finish_reason == "stop":
                hit = [s for s in params.stop if text.endswith(s)]
                if hit and (not c.token_ids or c.token_ids[-1] not in engine.eos_token_ids):
                    stop_reason = max(hit, key=len)
                    if not req["include_stop"]:
                        text = text[: -len(stop_reason)]
                elif c.token_ids:
                    stop_reason = c.token_ids[-1]
            choice = {"index": len(choices), "text": text, "finish_reason": c.finish_reason,
                      "stop_reason": stop_reason, "logprobs": None}
            if req["logprobs"] is not None:
                pieces = ([f"token_id:{t}" for t in c.token_ids] if req["tokens_as_ids"]
                          else [tok.decode([t]) for t in c.token_ids])
                offsets, pos = [], 0
                for t in c.token_ids:
                    offsets.append(pos)
                    pos += len(tok.decode([t]))
                choice["logprobs"] = {"tokens": pieces, "token_logprobs": list(c.logprobs),
                                      "top_logprobs": [{p: lp} for p, lp in zip(pieces, c.logprobs)],
                                      "text_offset": offsets}
            if req["return_token_ids"]:
                choice["token_ids"] = list(c.token_ids)
                choice["prompt_token_ids"] = list(c.prompt_token_ids)
            choices.append(choice)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                      "total_tokens": n_prompt + n_completion}}


def make_server(engine, host: str = "127.0.0.1", port: int = 8000,
                model_name: str = "rlcurate") -> ThreadingHTTPServer:
    """An HTTP server (not yet started: call ``serve_forever``) that serves ``engine`` (chapter 4).

    ``port=0`` picks a free port; read it back from ``server.server_address[1]``.
    """
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log.debug("%s - %s", self.address_string(), fmt % args)

        def _send(self, status: int, payload: dict):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, param: str | None = None):
            kind = "invalid_request_error" if status < 500 else "internal_error"
            self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

        def do_GET(self):
            path = self.path.split("?")[0].rstrip("/")
            if path == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "rlcurate"}]})
            elif path == "/health":
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route GET {self.path}")

        def do_POST(self):
            path = self.path.split("?")[0].rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path != "/v1/completions":
                self._error(404, f"no route POST {self.path}; this server has /v1/completions only")
                return
            try:
                body = json.loads(raw or b"null")
                req = parse_request(body)
                if body.get("model") not in (None, model_name):
                    raise RequestError(f"the model {body['model']!r} does not exist; this server serves "
                                       f"{model_name!r}", status=404, param="model")
                with lock:
                    payload = completion_response(engine, model_name, req)
            except json.JSONDecodeError as exc:
                self._error(400, f"the request body is not valid JSON: {exc}")
            except RequestError as exc:
                self._error(exc.status, str(exc), exc.param)
            except ValueError as exc:  # the engine's own input checks (e.g. a token id out of range)
                self._error(400, str(exc))
            except Exception as exc:  # report, keep serving
                log.exception("request failed")
                self._error(500, f"{type(exc).__name__}: {exc}")
            else:
                self._send(200, payload)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv=None) -> None:
    """Command line (chapter 4): ``python -m rlcurate.rollout.server --model PATH [--port P]``."""
    ap = argparse.ArgumentParser(prog="python -m rlcurate.rollout.server", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory or Hub id (loaded with AutoModelForCausalLM)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    ap.add_argument("--served-model-name", default=None, help="name in /v1/models (default: --model)")
    ap.add_argument("--token-budget", type=int, default=16384, help="tokens per generation batch")
    ap.add_argument("--device", default=None, help="e.g. cuda; default: where the model loads (CPU)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)

    import torch

    from .hf import TransformersEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    engine = TransformersEngine.from_pretrained(args.model, dtype=getattr(torch, args.dtype),
                                                device=args.device, token_budget=args.token_budget)
    name = args.served_model_name or args.model
    server = make_server(engine, args.host, args.port, name)
    host, port = server.server_address[:2]
    print(f"rlcurate.rollout.server: serving {name!r} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
