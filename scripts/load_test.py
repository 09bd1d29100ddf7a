#!/usr/bin/env python3
"""Load test for an OpenAI-compatible server (arbor, vLLM, SGLang, TensorRT-LLM serve):
`concurrency` clients each stream completions back to back for `duration` seconds (or until
`requests` are done), prompts drawn in order from a JSONL prompt set (MT-bench style
{"turns": [...]} or {"prompt": ...}) or a text file. Reports output tokens/s, requests/s,
time-to-first-token and time-per-output-token percentiles, and the server's speculation
figures when it reports them (arbor's usage.speculation).

  python3 scripts/load_test.py --url http://127.0.0.1:8000 --prompts ../shared/data/prompts/mt_bench.jsonl \\
      --concurrency 1,8,32 --max-tokens 128 --requests 64

Standard library only. Prints a markdown table; --json FILE writes the rows.
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def load_prompts(path, chat):
    prompts = []
    with open(path) as f:
        if path.endswith(".jsonl"):
            for line in f:
                line = line.strip()
                if not line:
                    continue
                d = json.loads(line)
                text = d.get("prompt") or d.get("text") or (d.get("turns") or [""])[0]
                prompts.append(text)
        else:
            prompts = [l.rstrip("\n") for l in f if l.strip()]
    return prompts


def one_request(url, model, prompt, max_tokens, temperature, chat, extra, api_key):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    body.update(extra)
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        data = r.read()
        conn.close()
        return {"error": f"{r.status} {data[:200]!r}"}
    first = None
    usage = None
    chunks = 0
    buf = b""
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        payload = line[6:]
        if payload == b"[DONE]":
            break
        d = json.loads(payload)
        if d.get("usage"):
            usage = d["usage"]
        for c in d.get("choices", []):
            text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
            if text:
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    conn.close()
    del buf
    out = (usage or {}).get("completion_tokens", chunks)
    return {"ttft": (first or end) - t0, "latency": end - t0, "tokens": out,
            "tpot": (end - first) / (out - 1) if first and out > 1 else None, "usage": usage}


def run_level(args, prompts, model, concurrency):
    results = []
    lock = threading.Lock()
    counter = [0]
    deadline = time.perf_counter() + args.duration if args.duration else None

    def worker():
        while True:
            with lock:
                i = counter[0]
                if (args.requests and i >= args.requests) or \
                        (deadline and time.perf_counter() > deadline):
                    return
                counter[0] += 1
            res = one_request(args.url, model, prompts[i % len(prompts)], args.max_tokens,
                              args.temperature, args.chat, json.loads(args.extra), args.api_key)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    toks = sum(r["tokens"] for r in ok)
    ttft = sorted(r["ttft"] for r in ok)
    tpot = sorted(r["tpot"] for r in ok if r["tpot"] is not None)
    spec = [r["usage"].get("speculation") for r in ok if r["usage"] and r["usage"].get("speculation")]
    steps = sum(s["decode_steps"] for s in spec)
    mean_len = (sum(s["mean_accepted_length"] * s["decode_steps"] for s in spec) / steps
                if steps else None)

    def pct(xs, p):
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

    return {"concurrency": concurrency, "requests": len(ok), "errors": len(errors),
            "wall_s": wall, "output_tok_s": toks / wall, "req_s": len(ok) / wall,
            "ttft_p50_ms": 1e3 * pct(ttft, 0.5), "ttft_p99_ms": 1e3 * pct(ttft, 0.99),
            "tpot_p50_ms": 1e3 * (statistics.median(tpot) if tpot else float("nan")),
            "mean_accepted_length": mean_len, "first_error": errors[0] if errors else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="", help="default: the server's first model")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=64, help="per level (0: use --duration)")
    ap.add_argument("--duration", type=float, default=0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--extra", default="{}", help="JSON merged into every request body")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    prompts = load_prompts(args.prompts, args.chat)
    model = args.model
    if not model:
        u = urllib.parse.urlparse(args.url)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + args.api_key}
                     if args.api_key else {})
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
    rows = []
    print(f"| {'label':<14} | conc | req | err | out tok/s | req/s | TTFT p50 ms | TTFT p99 ms "
          f"| TPOT p50 ms | accepted len |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in [int(x) for x in args.concurrency.split(",")]:
        row = run_level(args, prompts, model, c)
        row["label"] = args.label
        rows.append(row)
        ml = row["mean_accepted_length"]
        print(f"| {args.label:<14} | {c} | {row['requests']} | {row['errors']} | "
              f"{row['output_tok_s']:.1f} | {row['req_s']:.2f} | {row['ttft_p50_ms']:.1f} | "
              f"{row['ttft_p99_ms']:.1f} | {row['tpot_p50_ms']:.2f} | "
              f"{'-' if ml is None else f'{ml:.2f}'} |", flush=True)
        if row["first_error"]:
            print("  first error:", row["first_error"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
