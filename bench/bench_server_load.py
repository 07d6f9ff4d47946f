"""`rlcurate serve` under 16 concurrent clients while one asks for the most the server allows (issue #30, chapter 4).

The real command line serves a checkpoint (default: SmolLM2-135M-Instruct's local export, one thread) with
``--request-timeout T``. Two scenes, each from a fresh set of connections:

1. **Load**: one client asks for the largest request the limits let through (``n`` = ``--max-n`` samples of one
   prompt, ``max_tokens`` the rest of the context); half a second later 16 clients each send a small chat request
   at once. Every small client must be answered 200 within ``T`` of sending; the large one is answered 200 or,
   when it cannot finish in ``T``, 504 at ``T``.
2. **Disconnect**: a client sends the largest request and closes its connection after one second; a small request
   sent right after must be answered at once (the abandoned generation stopped instead of holding the model), and
   the server's log must say the client went away.

Latencies are seconds on the wall clock from each client's send; the result goes to
``data/bench/server_load.json``:

    .venv/bin/python bench/bench_server_load.py --timeout 60
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, REPO, header, write_json  # noqa: E402

SMALL = {"messages": [{"role": "user", "content": "What is 17 + 25? Answer with the number."}], "max_tokens": 16,
         "temperature": 1.0}


def start_server(model: str, timeout: float, threads: int, max_n: int) -> tuple[subprocess.Popen, int, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "rlcurate", "serve", "--model", model, "--port", "0",
                             "--served-model-name", "m", "--threads", str(threads), "--max-n", str(max_n),
                             "--request-timeout", str(timeout)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    lines: list[str] = []
    port = None
    for line in proc.stdout:
        lines.append(line.rstrip())
        m = re.search(r"serving .* on http://[\d.]+:(\d+)/v1", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("the server did not start:\n" + "\n".join(lines))
    threading.Thread(target=lambda: lines.extend(x.rstrip() for x in proc.stdout), daemon=True).start()
    return proc, port, lines


def post(port: int, path: str, body: dict, wait: float) -> tuple[int, float, str]:
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=wait)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = json.loads(resp.read())
    conn.close()
    return resp.status, time.monotonic() - t0, payload.get("error", {}).get("message", "")


def scene_load(port: int, body: dict, timeout: float, clients: int) -> dict:
    results: dict = {}

    def run(key, b):
        try:
            results[key] = post(port, "/v1/chat/completions", b, timeout + 120)
        except Exception as exc:  # a reset or a client-side timeout is a failure of the scene
            results[key] = (None, None, f"{type(exc).__name__}: {exc}")

    big = threading.Thread(target=run, args=("large", body))
    big.start()
    time.sleep(0.5)
    threads = [threading.Thread(target=run, args=(k, {**SMALL, "seed": k})) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads + [big]:
        t.join()
    small = [results[k] for k in range(clients)]
    return {"large": {"status": results["large"][0], "seconds": results["large"][1], "error": results["large"][2]},
            "small": [{"status": s, "seconds": t, "error": e} for s, t, e in small],
            "small_all_200": all(s == 200 for s, _, _ in small),
            "small_max_seconds": max(t for _, t, _ in small if t is not None) if any(t for _, t, _ in small) else None,
            "small_within_timeout": all(s == 200 and t <= timeout for s, t, _ in small)}


def scene_disconnect(port: int, body: dict, lines: list[str]) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    time.sleep(1.0)
    conn.sock.close()  # the client goes away without reading an answer
    conn.close()
    t0 = time.monotonic()
    status, seconds, _ = post(port, "/v1/chat/completions", {**SMALL, "seed": 99}, 600)
    time.sleep(0.5)
    return {"next_status": status, "next_seconds": seconds, "seconds_after_close": time.monotonic() - t0,
            "server_logged_went_away": any("went away" in x for x in lines)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2-135M-Instruct's local export)")
    ap.add_argument("--timeout", type=float, default=60.0, help="the server's --request-timeout")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=None, help="the large request's max_tokens (default: the "
                                                                   "rest of the context, capped at 2,048)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(DATA / "server_load.json"))
    args = ap.parse_args()
    if args.model is None:
        from rlcurate.models.hf import load_smollm2, smollm2_cache_dir

        if not (smollm2_cache_dir() / "config.json").is_file():
            load_smollm2()  # exports the local checkpoint once
        args.model = str(smollm2_cache_dir())
    proc, port, lines = start_server(args.model, args.timeout, args.threads, args.max_n)
    try:
        context = json.loads((Path(args.model) / "config.json").read_text())["max_position_embeddings"]
        body = {**SMALL, "n": args.max_n, "max_tokens": args.max_tokens or min(context - 64, 2048), "seed": 1}
        load = scene_load(port, body, args.timeout, args.clients)
        disconnect = scene_disconnect(port, body, lines)
    finally:
        proc.terminate()
        proc.wait(30)
    result = header("rlcurate serve under concurrent clients (issue #30)", threads=args.threads)
    result.update(config={"model": args.model, "request_timeout": args.timeout, "clients": args.clients,
                          "large_request": {k: v for k, v in body.items() if k != "messages"},
                          "small_request": {k: v for k, v in SMALL.items() if k != "messages"}},
                  load=load, disconnect=disconnect, server_log=lines[-20:])
    write_json(result, args.out)
    print(json.dumps({"load": {k: v for k, v in load.items() if k != "small"}, "disconnect": disconnect}, indent=1))
    ok = load["small_within_timeout"] and load["large"]["status"] in (200, 504) and disconnect["next_status"] == 200
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
