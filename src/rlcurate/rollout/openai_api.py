"""A rollout backend that calls an OpenAI-compatible HTTP server (chapter 4, *The variance audit*).

It lets an audit run against a model served elsewhere: ``vllm serve``, SGLang, or this package's own
:mod:`rlcurate.rollout.server`, through ``/v1/completions`` (rendered prompts) or
``/v1/chat/completions`` (chat turns; the server applies the chat template). Only the standard
library is used (``urllib`` plus a thread pool for concurrent requests).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from .base import Completion, RolloutEngine, SamplingParams, check_seed, normalize_request, prompt_seed

_STOP_REASONS = {"stop": "stop", "eos": "stop", "stop_sequence": "stop", "length": "length"}
ENDPOINTS = ("completions", "chat")
ROLES = ("system", "developer", "user", "assistant")


class OpenAIServerError(RuntimeError):
    """An OpenAI-compatible server answered with an HTTP error (chapter 4); ``status`` is its code
    and the message includes the server's own."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class MalformedResponseError(RuntimeError):
    """A server's answer is not a well-formed ``/v1/completions`` or ``/v1/chat/completions`` response
    (chapter 4); the message names the URL and what is wrong."""


def conversation(task, problem, hint: str | None = None) -> list[dict[str, str]]:
    """The chat turns that pose ``problem`` for ``/v1/chat/completions`` (chapter 4): the task's
    messages, then its prefill (if any) as a final assistant message for the server to continue.
    A server that renders them with ``continue_final_message`` gives the same text as
    ``task.render(problem, tokenizer, hint)``."""
    messages = [dict(m) for m in task.messages(problem, hint)]
    prefill = task.prefill(problem, hint) if hint is not None else task.prefill(problem)
    if prefill:
        messages.append({"role": "assistant", "content": prefill})
    return messages


def check_conversation(messages, where: str = "messages") -> list[dict[str, str]]:
    """``messages`` as a list of ``{"role", "content"}`` dicts with string contents (a content given as
    OpenAI text parts is joined); raises ``ValueError`` naming the first bad entry (chapter 4)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} messages, "
                         f"got {str(messages)[:100]}")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"{where}[{k}] must be an object with 'role' and 'content', got {str(m)[:100]}")
        if m.get("role") not in ROLES:
            raise ValueError(f"{where}[{k}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        content = m.get("content")
        if isinstance(content, list) and content and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)  # OpenAI's content parts, text only
        if not isinstance(content, str):
            raise ValueError(f"{where}[{k}].content must be a string or a list of text parts, got "
                             f"{str(content)[:100]}")
        out.append({"role": m["role"], "content": content})
    return out


def _normalise_base_url(base_url: str) -> str:
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"base_url must be an http(s) URL such as http://localhost:8000/v1, got {base_url!r}")
    url = base_url.rstrip("/")
    if parsed.path in ("", "/"):
        url += "/v1"
    return url


class OpenAIEngine(RolloutEngine):
    """Samples completions from an OpenAI-compatible server (chapter 4).

    One request per prompt (with ``n = n_i`` samples and ``seed = prompt_seed(seed, i)``), up to
    ``max_concurrency`` in flight, so a server that batches continuously (vLLM) sees them together and
    the samples of a prompt do not depend on the other prompts.

    ``endpoint="completions"`` (default) posts to ``/v1/completions``; a prompt is a rendered text or
    a list of token ids. Request fields: ``prompt``, ``n``, ``temperature``, ``top_p``, ``max_tokens``,
    ``logprobs=1``, ``seed``, ``stop``. ``endpoint="chat"`` posts to ``/v1/chat/completions``; a
    prompt is a list of ``{"role", "content"}`` messages (see :func:`conversation`) or a string (one
    user message), and ``logprobs=true`` replaces ``logprobs=1``. A conversation that ends with an
    assistant message is continued (a prefill): that needs the vLLM fields ``add_generation_prompt``
    and ``continue_final_message``, so it needs ``vllm_extras=True``.

    With ``vllm_extras=True`` (default) it also sends fields that vLLM and :mod:`.server` understand
    and other servers are expected to ignore: ``top_k`` (-1 for none), neutral ``repetition_penalty``
    and ``min_p`` (vLLM otherwise applies the checkpoint's ``generation_config`` defaults),
    ``include_stop_str_in_output`` (this package's inclusive stop-string convention), and
    ``return_token_ids`` / ``return_tokens_as_token_ids`` (to get token ids back). With
    ``vllm_extras=False`` only standard OpenAI fields are sent; then ``top_k`` must be 0, and
    ``token_ids`` / ``prompt_token_ids`` are empty unless the server reports them.

    ``logprobs`` are the server's per-token log-probs: with :mod:`.server` they follow this package's
    convention (``log softmax(logits / T)``); a vLLM server reports raw, temperature-1 log-probs unless
    started with ``--logprobs-mode processed_logprobs``. A server that returns no log-probs gives ``[]``.

    Failures name the URL: :class:`OpenAIServerError` (an HTTP error status, with the server's own
    message), :class:`MalformedResponseError` (not JSON, or not the expected schema),
    ``ConnectionError`` (no connection, a broken one, or no valid HTTP answer) and ``TimeoutError``
    (no answer within ``timeout``), the last two after ``max_retries`` further attempts.

    Args:
        base_url: the API root, e.g. ``http://localhost:8000/v1`` (``/v1`` is added to a bare host).
        model: the served model name (see :meth:`models`).
        api_key: sent as a bearer token; default the ``OPENAI_API_KEY`` environment variable, if set.
        timeout: seconds to wait for one response.
        max_retries: extra attempts after a connection failure, a timeout, HTTP 429 or a 5xx error other than
            504 (the server's own request timeout, which the same request would meet again).
        max_concurrency: the most requests in flight at once.
        vllm_extras: send the non-standard fields above.
        endpoint: ``"completions"`` or ``"chat"``.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                 max_retries: int = 2, max_concurrency: int = 8, vllm_extras: bool = True,
                 endpoint: str = "completions"):
        self.base_url = _normalise_base_url(base_url)
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if not (timeout > 0):
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        self.timeout, self.max_retries = float(timeout), int(max_retries)
        self.max_concurrency = int(max_concurrency)
        self.vllm_extras = bool(vllm_extras)
        self.endpoint = endpoint
        self.path = "/chat/completions" if endpoint == "chat" else "/completions"

    # ---------------------------------------------------------------- HTTP
    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempts = f"{self.max_retries + 1} attempt{'s' if self.max_retries else ''}"
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                req = urllib.request.Request(url, data=data, headers=headers, method=method)
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                break
            except urllib.error.HTTPError as exc:
                message = _error_message(exc)
                if last or not (exc.code == 429 or exc.code >= 500) or exc.code == 504:  # 504: it ran out of time; so would a retry
                    raise OpenAIServerError(f"HTTP {exc.code} from {url}: {message}", exc.code) from None
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                if last and isinstance(reason, TimeoutError):
                    raise TimeoutError(f"the OpenAI-compatible server at {url} gave no answer within "
                                       f"{self.timeout:g} s ({attempts})") from None
                if last and isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError):
                    raise ConnectionError(f"{url} did not answer with valid HTTP ({attempts}): "
                                          f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
                if last:
                    raise ConnectionError(f"cannot reach the OpenAI-compatible server at {url} ({attempts}): "
                                          f"{reason}") from None
            time.sleep(min(0.25 * 2**attempt, 8.0))
        try:
            return json.loads(raw)
        except ValueError:
            raise MalformedResponseError(f"{url} did not return JSON: {raw[:200]!r}") from None

    def models(self) -> list[str]:
        """The model names the server lists at ``/v1/models`` (a cheap check that it is up)."""
        payload = self._request("GET", "/models")
        try:
            return [m["id"] for m in payload["data"]]
        except (KeyError, TypeError):
            raise MalformedResponseError(f"{self.base_url}/models: expected {{'data': [{{'id': ...}}]}}, "
                                         f"got {str(payload)[:200]}") from None

    # ---------------------------------------------------------------- generation
    def generate(self, prompts, n, params: SamplingParams, seed: int = 0, progress: bool = False):
        """As :meth:`RolloutEngine.generate`; with ``endpoint="chat"`` a prompt is a list of
        ``{"role", "content"}`` messages (or a string, sent as one user message)."""
        if self.endpoint == "completions":
            return super().generate(prompts, n, params, seed, progress)
        if isinstance(prompts, (str, bytes)):
            raise ValueError("prompts must be a list of prompts, got a single string; wrap it in a list")
        convs = [[{"role": "user", "content": p}] if isinstance(p, str) else check_conversation(p, f"prompts[{i}]")
                 for i, p in enumerate(prompts)]
        _, counts = normalize_request([str(i) for i in range(len(convs))], n)  # checks n against the prompts
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        seed = check_seed(seed)
        return self._generate(convs, counts, params, seed, bool(progress)) if convs else []

    def request_body(self, prompt, n: int, params: SamplingParams, seed: int) -> dict:
        """The JSON body of one request to :attr:`path` (public so that it can be inspected)."""
        body: dict[str, Any] = {"model": self.model, "n": n, "temperature": params.temperature,
                                "top_p": params.top_p, "max_tokens": params.max_new_tokens, "seed": seed}
        if self.endpoint == "chat":
            body.update(messages=prompt, logprobs=True)
            if prompt[-1]["role"] == "assistant":
                if not self.vllm_extras:
                    raise ValueError("a conversation that ends with an assistant message (a prefill) needs "
                                     "vllm_extras=True: the OpenAI API cannot continue a message")
                body.update(add_generation_prompt=False, continue_final_message=True)
        else:
            body.update(prompt=prompt, logprobs=1)
        if params.stop:
            body["stop"] = list(params.stop)
        if self.vllm_extras:
            body.update(top_k=params.top_k if params.top_k > 0 else -1, min_p=0.0, repetition_penalty=1.0,
                        include_stop_str_in_output=True, return_token_ids=True,
                        return_tokens_as_token_ids=True)
        elif params.top_k > 0:
            raise ValueError("top_k > 0 needs vllm_extras=True: the OpenAI API has no top_k field")
        return body

    def _generate(self, prompts, counts, params, seed, progress):
        if params.top_k > 0 and not self.vllm_extras:
            raise ValueError("top_k > 0 needs vllm_extras=True: the OpenAI API has no top_k field")
        jobs = [i for i, c in enumerate(counts) if c > 0]
        bodies = {i: self.request_body(prompts[i], counts[i], params, prompt_seed(seed, i)) for i in jobs}
        results: list[list[Completion]] = [[] for _ in prompts]

        def one(i):
            return i, self._parse(self._request("POST", self.path, bodies[i]), i, prompts[i], counts[i])

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, max(1, len(jobs)))) as pool, \
                tqdm(total=sum(counts), unit="completion", disable=not progress, desc="rollout") as bar:
            for i, comps in pool.map(one, jobs):
                results[i] = comps
                bar.update(len(comps))
        return results

    def _parse(self, payload, i: int, prompt, n: int) -> list[Completion]:
        where = self.base_url + self.path
        try:
            choices = sorted(payload["choices"], key=lambda c: c.get("index", 0))
        except (KeyError, TypeError, AttributeError):
            raise MalformedResponseError(
                f"{where}: response has no 'choices' list: {str(payload)[:200]}") from None
        if len(choices) != n:
            raise MalformedResponseError(f"{where}: asked for n={n} completions, got {len(choices)}")
        out = []
        for j, ch in enumerate(choices):
            try:
                out.append(self._choice(payload, ch, i, j, prompt))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise MalformedResponseError(f"{where}: choice {j} is malformed ({type(exc).__name__}: {exc}): "
                                             f"{str(ch)[:200]}") from None
        return out

    def _choice(self, payload, ch, i: int, j: int, prompt) -> Completion:
        where = self.base_url + self.path
        if self.endpoint == "chat":
            text = ch["message"]["content"] if isinstance(ch, dict) and isinstance(ch.get("message"), dict) else None
            if not isinstance(text, str):
                raise MalformedResponseError(f"{where}: choice {j} has no 'message.content' string: {str(ch)[:200]}")
            entries = (ch.get("logprobs") or {}).get("content") or []
            logprobs = [float(e["logprob"]) for e in entries]
            tokens = [e.get("token") for e in entries]
        else:
            if not isinstance(ch, dict) or not isinstance(ch.get("text"), str):
                raise MalformedResponseError(f"{where}: choice {j} has no 'text' string: {str(ch)[:200]}")
            text = ch["text"]
            lp = ch.get("logprobs") or {}
            logprobs = [float(x) for x in lp.get("token_logprobs") or []]
            tokens = lp.get("tokens") or []
        reason = _STOP_REASONS.get(ch.get("finish_reason"))
        if reason is None:
            raise MalformedResponseError(f"{where}: choice {j} has finish_reason {ch.get('finish_reason')!r}")
        token_ids = ch.get("token_ids")
        if token_ids is None:
            token_ids = [int(t[9:]) for t in tokens if isinstance(t, str) and t.startswith("token_id:")]
            if len(token_ids) != len(tokens):
                token_ids = []
        prompt_ids = ch.get("prompt_token_ids") or payload.get("prompt_token_ids")
        if prompt_ids is None:
            prompt_ids = list(prompt) if prompt and isinstance(prompt[0], int) else []
        return Completion(prompt_index=i, sample_index=j, prompt_token_ids=[int(t) for t in prompt_ids],
                          token_ids=[int(t) for t in token_ids], text=text, logprobs=logprobs,
                          finish_reason=reason)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()
    except Exception:  # the body may be gone; the status line is still useful
        return exc.reason or ""
    try:
        err = json.loads(raw)
        if isinstance(err, dict):
            e = err.get("error", err)
            return str(e.get("message", e)) if isinstance(e, dict) else str(e)
    except ValueError:
        pass
    return raw.decode(errors="replace")[:500] or str(exc.reason)
