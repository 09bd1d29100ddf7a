#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (arbor, vLLM, SGLang, TensorRT-LLM serve),
in the terms of vLLM's `vllm bench serve` and SGLang's bench_serving: open loop (Poisson or
gamma arrivals at --request-rate, optionally capped by --max-concurrency) and closed loop
(--concurrency clients sending back to back); streaming completions or chat; MT-bench / prompt
file, random-length and shared-prefix datasets. Reports request and token throughput, goodput
under SLOs, TTFT / TPOT / ITL / end-to-end latency (mean, median, p90, p99) and the server's
acceptance length when it reports one (arbor's usage.speculation). Writes JSON and CSV;
`plot` draws PNGs from result JSONs (matplotlib, optional). docs/serving_benchmark.md defines
every metric.

  python3 scripts/bench_serve.py --base-url http://127.0.0.1:8000 --dataset mt-bench \\
      --request-rate 1,2,4,inf --num-prompts 200 --max-tokens 128 --result-json run.json
  python3 scripts/bench_serve.py --dataset random --random-input-len 512 --random-output-len 128 \\
      --concurrency 1,8,32 --ignore-eos --goodput ttft:500 tpot:50 --result-csv run.csv
  python3 scripts/bench_serve.py plot spec_on.json spec_off.json --labels on,off --out-dir plots

Standard library only (asyncio streams as the HTTP client); matplotlib for `plot`.
"""
import argparse
import asyncio
import csv
import datetime
import http.client
import json
import math
import os
import random
import ssl
import sys
import time
import urllib.parse

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_PROMPTS = os.path.join(REPO, "..", "shared", "data", "prompts", "mt_bench.jsonl")
# Used to build random prompts when no prompt file is at hand (text for the /tokenize pool).
FALLBACK_CORPUS = (
    "Once upon a time there was a little girl who lived in a village near the forest. "
    "Whenever she went out, she wore a red riding cloak, so everyone in the village called "
    "her Little Red Riding Hood. Compose an engaging travel blog post about a recent trip, "
    "highlighting cultural experiences and must-see attractions. Explain the difference "
    "between a list and a tuple in Python, with examples of when to use each one.")
PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


# ----------------------------------------------------------------------------- HTTP client


class Endpoint:
    """Where requests go: scheme, host, port, path prefix and headers."""

    def __init__(self, base_url, api_key):
        u = urllib.parse.urlparse(base_url.rstrip("/"))
        if u.scheme not in ("http", "https"):
            raise SystemExit(f"--base-url must be http:// or https://, got {base_url!r}")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        path = u.path
        if path.endswith("/v1"):  # accept both http://host:port and http://host:port/v1
            path = path[:-3]
        self.prefix = path
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def request_json(self, method, path, body=None, timeout=60):
        """A blocking request (set-up calls: /v1/models, /tokenize) -> (status, parsed body)."""
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, self.prefix + path,
                         json.dumps(body) if body is not None else None, self.headers)
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data.decode("utf-8", "replace")


async def _read_body(reader, headers):
    """Yields (bytes, arrival time) as the response body arrives (chunked, sized or to EOF)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return
            data = await reader.readexactly(size)
            yield data, time.perf_counter()
            await reader.readline()
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                return
            left -= len(data)
            yield data, time.perf_counter()
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data, time.perf_counter()


async def stream_request(endpoint, path, body, timeout):
    """POSTs one streaming request and times it. Returns a record (seconds, relative to the
    moment before connecting): ttft (first chunk carrying text), chunk_times (every chunk
    carrying text), e2el (the stream's end), usage (the last usage seen), error."""
    rec = {"ttft": None, "e2el": None, "chunk_times": [], "usage": None, "error": None}
    payload = json.dumps(body).encode()
    head = [f"POST {endpoint.prefix}{path} HTTP/1.1", f"Host: {endpoint.host}:{endpoint.port}",
            f"Content-Length: {len(payload)}", "Accept: text/event-stream", "Connection: close"]
    head += [f"{k}: {v}" for k, v in endpoint.headers.items()]
    writer = None
    start = time.perf_counter()
    try:
        ssl_ctx = ssl.create_default_context() if endpoint.https else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(endpoint.host, endpoint.port, ssl=ssl_ctx, limit=1 << 22),
            timeout)
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        parts = status_line.decode("latin-1").split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if status != 200:
            body_bytes = b""
            async for data, _ in _read_body(reader, headers):
                body_bytes += data
                if len(body_bytes) > 2000:
                    break
            rec["error"] = f"HTTP {status}: {body_bytes[:300].decode('utf-8', 'replace')}"
            return rec
        buf = b""
        done = False
        body_iter = _read_body(reader, headers).__aiter__()
        while not done:
            try:
                data, now = await asyncio.wait_for(body_iter.__anext__(), timeout)
            except StopAsyncIteration:
                break
            buf += data
            while not done and b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, SSE comments (": keep-alive"), event names
                event = line[5:].strip()
                if event == b"[DONE]":
                    done = True
                    break
                msg = json.loads(event)
                if msg.get("error"):
                    rec["error"] = "stream error: " + json.dumps(msg["error"])[:300]
                if msg.get("usage"):
                    rec["usage"] = msg["usage"]
                for choice in msg.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = choice.get("text") or delta.get("content") or \
                        delta.get("reasoning_content") or delta.get("reasoning")
                    if text:
                        rec["chunk_times"].append(now - start)
                        break
        rec["e2el"] = time.perf_counter() - start
        if rec["error"] is None and not done:
            rec["error"] = "stream ended without [DONE]"
        if rec["ttft"] is None and rec["chunk_times"]:
            rec["ttft"] = rec["chunk_times"][0]
    except asyncio.TimeoutError:
        rec["error"] = f"timed out after {timeout} s"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    return rec


# ----------------------------------------------------------------------------- datasets


def load_prompts(path):
    """Prompt texts from a JSONL file (MT-bench {"turns": [...]}: the first turn; {"prompt"} or
    {"text"}) or a text file (one prompt per line)."""
    prompts = []
    with open(path) as f:
        if path.endswith(".jsonl"):
            for line in f:
                line = line.strip()
                if not line:
                    continue
                d = json.loads(line)
                text = d.get("prompt") or d.get("text") or (d.get("turns") or [""])[0]
                if text:
                    prompts.append(text)
        else:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise SystemExit(f"no prompts in {path}")
    return prompts


class Tokenizer:
    """The server's /tokenize (arbor, vLLM and SGLang serve one), when it answers."""

    def __init__(self, endpoint, model):
        self.endpoint = endpoint
        self.model = model
        status, _ = endpoint.request_json("POST", "/tokenize", self._body("hello"))
        self.available = status == 200

    def _body(self, text):
        return {"model": self.model, "prompt": text, "add_special_tokens": False}

    def encode(self, text):
        status, d = self.endpoint.request_json("POST", "/tokenize", self._body(text))
        if status != 200:
            raise SystemExit(f"/tokenize answered {status}: {str(d)[:200]}")
        return d["tokens"]


class PromptMaker:
    """Builds prompts of a given token count: token ids for completions (the OpenAI API takes a
    list of ints as the prompt), text for chat. Ids are drawn from those the server's tokenizer
    produces for a real corpus (no special tokens); text is corpus words, grown or cut until
    /tokenize counts the target. Without /tokenize, text of about 4/3 tokens per word."""

    def __init__(self, tokenizer, corpus_texts, use_ids, rng, id_range=None):
        self.tokenizer = tokenizer
        self.rng = rng
        self.words = " ".join(corpus_texts).split()
        self.use_ids = use_ids and (tokenizer.available or id_range is not None)
        self.exact = tokenizer.available
        if id_range is not None:  # ids without a tokenizer (--token-id-range)
            self.id_pool = range(*id_range)
        elif tokenizer.available:
            sample = " ".join(self.words[:2000])
            ids = tokenizer.encode(sample)
            self.id_pool = sorted(set(ids))
            self.tokens_per_word = max(len(ids), 1) / max(len(sample.split()), 1)
        else:
            self.tokens_per_word = 4 / 3

    def make(self, n_tokens):
        """-> (prompt: list of ids or text, token count or None when unknown)."""
        if self.use_ids:
            return [self.rng.choice(self.id_pool) for _ in range(n_tokens)], n_tokens
        start = self.rng.randrange(len(self.words))
        words = [self.words[(start + i) % len(self.words)]
                 for i in range(int(n_tokens / self.tokens_per_word) + 8)]
        if not self.exact:
            return " ".join(words[:max(1, round(n_tokens / self.tokens_per_word))]), None
        # Cut words until the text is at most n_tokens, then trim the last word's tokens away
        # by re-encoding shorter prefixes (a few /tokenize calls per prompt).
        n_words = max(1, round(n_tokens / self.tokens_per_word))
        best = None
        for _ in range(12):
            text = " ".join(words[:n_words])
            count = len(self.tokenizer.encode(text))
            if count <= n_tokens and (best is None or count > best[1]):
                best = (text, count)
            if count == n_tokens:
                break
            step = max(1, int(abs(n_tokens - count) / self.tokens_per_word))
            n_words = max(1, n_words + (step if count < n_tokens else -step))
            while n_words > len(words):
                words.append(self.words[self.rng.randrange(len(self.words))])
        if best is None:
            text = " ".join(words[:1])
            best = (text, len(self.tokenizer.encode(text)))
        return best


def uniform_lengths(rng, n, mean_len, ratio):
    """vLLM's random lengths: integers uniform in [mean*(1-ratio), mean*(1+ratio)], at least 1."""
    lo = max(1, int(mean_len * (1 - ratio)))
    hi = max(lo, int(mean_len * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def build_requests(args, endpoint, model):
    """-> list of {"prompt" (text, ids) or "system"/"user" texts, "max_tokens", "input_len"
    (None when unknown before sending), "group"}; always args.num_prompts long."""
    rng = random.Random(args.seed)
    chat = args.endpoint == "chat"
    if args.dataset in ("mt-bench", "file"):
        path = args.dataset_path or DEFAULT_PROMPTS
        prompts = load_prompts(path)
        order = list(range(len(prompts)))
        rng.shuffle(order)
        n = args.num_prompts or len(prompts)
        return [{"prompt": prompts[order[i % len(order)]], "max_tokens": args.max_tokens,
                 "input_len": None, "group": None} for i in range(n)]
    corpus_path = args.dataset_path or DEFAULT_PROMPTS
    corpus = load_prompts(corpus_path) if os.path.exists(corpus_path) else [FALLBACK_CORPUS]
    id_range = args.token_id_range
    if id_range is not None and chat:
        raise SystemExit("--token-id-range: chat requests are text; use --endpoint completions")
    tokenizer = Tokenizer(endpoint, model)
    if not tokenizer.available and id_range is None:
        print("[bench] the server has no /tokenize: prompts are text of about the requested "
              "length (input tokens are counted from the server's usage)", file=sys.stderr)
    maker = PromptMaker(tokenizer, corpus, use_ids=not chat, rng=rng, id_range=id_range)
    reqs = []
    if args.dataset == "random":
        n = args.num_prompts or 200
        in_lens = uniform_lengths(rng, n, args.random_input_len, args.random_range_ratio)
        out_lens = uniform_lengths(rng, n, args.random_output_len, args.random_range_ratio)
        for in_len, out_len in zip(in_lens, out_lens):
            prompt, count = maker.make(in_len)
            reqs.append({"prompt": prompt, "max_tokens": out_len, "input_len": count,
                         "group": None})
        return reqs
    # shared-prefix (SGLang's generated-shared-prefix): groups of prompts sharing one long
    # system prefix, each with its own question; shuffled so groups interleave in time.
    for g in range(args.gsp_num_groups):
        prefix, prefix_len = maker.make(args.gsp_system_prompt_len)
        for _ in range(args.gsp_prompts_per_group):
            question, q_len = maker.make(args.gsp_question_len)
            req = {"max_tokens": args.gsp_output_len, "group": g,
                   "input_len": prefix_len + q_len if prefix_len is not None
                   and q_len is not None else None}
            if chat:
                req["system"], req["user"] = prefix, question
            elif isinstance(prefix, list):
                req["prompt"] = prefix + question
            else:
                req["prompt"] = prefix + "\n\n" + question
            reqs.append(req)
    rng.shuffle(reqs)
    n = args.num_prompts or len(reqs)
    return [reqs[i % len(reqs)] for i in range(n)]


def request_body(args, model, req):
    body = {"model": model, "max_tokens": req["max_tokens"], "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if args.seed_requests:
        body["seed"] = args.seed
    body.update(args.extra_body)
    if args.endpoint == "chat":
        if "prompt" in req:
            messages = [{"role": "user", "content": req["prompt"]}]
        else:
            messages = [{"role": "system", "content": req["system"]},
                        {"role": "user", "content": req["user"]}]
        body["messages"] = messages
        return "/v1/chat/completions", body
    body["prompt"] = req["prompt"]
    return "/v1/completions", body


# ----------------------------------------------------------------------------- load


def arrival_offsets(rng, n, rate, burstiness):
    """Send times (s from the start): gamma-distributed gaps with shape `burstiness` and mean
    1/rate (burstiness 1 = Poisson; < 1 burstier, > 1 more regular), as vLLM. rate inf: all 0."""
    if math.isinf(rate):
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


async def run_level(args, endpoint, model, reqs, rate=None, concurrency=None):
    """Runs one load level: open loop at `rate` (with args.max_concurrency as a cap), or closed
    loop with `concurrency` clients. Returns the per-request records, the duration and the
    wall-clock start (seconds since the epoch)."""
    records = [None] * len(reqs)
    wall_start = time.time()
    bench_start = time.perf_counter()

    async def one(i):
        path, body = request_body(args, model, reqs[i])
        sent = time.perf_counter() - bench_start
        rec = await stream_request(endpoint, path, body, args.timeout)
        rec["start"] = sent
        rec["index"] = i
        records[i] = rec

    if concurrency is not None:
        next_index = iter(range(len(reqs)))

        async def client():
            for i in next_index:
                await one(i)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    else:
        rng = random.Random(args.seed + 1)
        offsets = arrival_offsets(rng, len(reqs), rate, args.burstiness)
        cap = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

        async def capped(i):
            if cap is None:
                return await one(i)
            async with cap:  # a request waiting here is not timed yet, as vLLM
                return await one(i)

        tasks = []
        for i, offset in enumerate(offsets):
            delay = bench_start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(capped(i)))
        await asyncio.gather(*tasks)
    return records, time.perf_counter() - bench_start, wall_start


# ----------------------------------------------------------------------------- metrics


def percentile(xs, p):
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(values_s):
    """mean, std, median, p90, p99 of values in seconds -> ms (None when empty)."""
    out = {}
    n = len(values_s)
    mean = sum(values_s) / n if n else None
    out["mean"] = mean * 1e3 if n else None
    out["std"] = (math.sqrt(sum((v - mean) ** 2 for v in values_s) / n) * 1e3) if n else None
    out["median"] = percentile(values_s, 50) * 1e3 if n else None
    for p in PERCENTILES[1:]:
        out[f"p{p}"] = percentile(values_s, p) * 1e3 if n else None
    return out


def finish_record(rec, req):
    """Adds output/input token counts, TPOT and ITL to a request record."""
    usage = rec.get("usage") or {}
    chunks = rec["chunk_times"]
    if isinstance(usage.get("completion_tokens"), int):
        rec["output_tokens"] = usage["completion_tokens"]
        rec["output_tokens_from"] = "usage"
    else:
        rec["output_tokens"] = len(chunks)
        rec["output_tokens_from"] = "chunks"
    rec["input_tokens"] = usage.get("prompt_tokens", req["input_len"])
    details = usage.get("prompt_tokens_details") or {}
    rec["cached_tokens"] = details.get("cached_tokens")
    rec["speculation"] = usage.get("speculation")
    rec["chunks"] = len(chunks)
    rec["itl"] = [b - a for a, b in zip(chunks, chunks[1:])]
    out = rec["output_tokens"]
    # vLLM's TPOT: the time after the first token spread over the tokens after the first.
    rec["tpot"] = (rec["e2el"] - rec["ttft"]) / (out - 1) if out > 1 else None
    return rec


def level_metrics(args, records, duration):
    ok = [r for r in records if r["error"] is None and r["ttft"] is not None]
    failed = [r for r in records if not (r["error"] is None and r["ttft"] is not None)]
    m = {"completed": len(ok), "failed": len(failed), "duration_s": duration}
    in_tokens = [r["input_tokens"] for r in ok if r["input_tokens"] is not None]
    m["total_input_tokens"] = sum(in_tokens)
    m["total_output_tokens"] = sum(r["output_tokens"] for r in ok)
    m["request_throughput"] = len(ok) / duration
    m["output_throughput"] = m["total_output_tokens"] / duration
    m["total_token_throughput"] = (m["total_input_tokens"] + m["total_output_tokens"]) / duration
    series = {
        "ttft": [r["ttft"] for r in ok],
        "tpot": [r["tpot"] for r in ok if r["tpot"] is not None],
        "itl": [x for r in ok for x in r["itl"]],
        "e2el": [r["e2el"] for r in ok],
    }
    for name in METRICS:
        for stat, v in summarize(series[name]).items():
            m[f"{stat}_{name}_ms"] = v
    chunks = sum(r["chunks"] for r in ok)
    m["mean_tokens_per_chunk"] = m["total_output_tokens"] / chunks if chunks else None
    m["output_tokens_from"] = ("usage" if all(r["output_tokens_from"] == "usage" for r in ok)
                               else "chunks")
    if args.goodput:
        good = 0
        for r in ok:
            values = {"ttft": r["ttft"], "tpot": r["tpot"] or 0.0, "e2el": r["e2el"]}
            good += all(values[k] * 1e3 <= slo for k, slo in args.goodput.items())
        m["good_requests"] = good
        m["request_goodput"] = good / duration
    cached = [r["cached_tokens"] for r in ok if r["cached_tokens"] is not None]
    if cached:
        m["total_cached_tokens"] = sum(cached)
    spec = [r["speculation"] for r in ok if r["speculation"]]
    if spec:
        steps = sum(s.get("decode_steps", 0) for s in spec)
        m["decode_steps"] = steps
        m["accepted_draft_tokens"] = sum(s.get("accepted_draft_tokens", 0) for s in spec)
        m["mean_accepted_length"] = (sum(s.get("mean_accepted_length", 0) * s.get("decode_steps", 0)
                                         for s in spec) / steps) if steps else None
    m["errors"] = sorted({r["error"] for r in failed})[:5]
    return m


# ----------------------------------------------------------------------------- output

CSV_FIELDS = (["label", "mode", "request_rate", "burstiness", "max_concurrency", "concurrency",
               "completed", "failed", "duration_s", "request_throughput", "request_goodput",
               "good_requests", "output_throughput", "total_token_throughput",
               "total_input_tokens", "total_output_tokens"] +
              [f"{s}_{n}_ms" for n in METRICS for s in ("mean", "std", "median", "p90", "p99")] +
              ["mean_tokens_per_chunk", "output_tokens_from", "total_cached_tokens",
               "mean_accepted_length", "accepted_draft_tokens", "decode_steps"])


def level_name(level):
    if level["mode"] == "closed":
        return f"conc={level['concurrency']}"
    rate = level["request_rate"]
    name = "rate=" + ("inf" if rate == "inf" else f"{rate:g}")
    if level.get("max_concurrency"):
        name += f",max={level['max_concurrency']}"
    return name


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def table_header():
    return ("| label | load | req | fail | req/s | goodput | out tok/s | total tok/s | "
            "TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | E2E p50 | "
            "acc len |\n" + "| --- " * 16 + "|")


def table_row(level):
    return (f"| {level['label']} | {level_name(level)} | {level['completed']} | {level['failed']} "
            f"| {fmt(level['request_throughput'], 2)} | {fmt(level.get('request_goodput'), 2)} "
            f"| {fmt(level['output_throughput'])} | {fmt(level['total_token_throughput'])} "
            f"| {fmt(level['median_ttft_ms'], 2)} | {fmt(level['p99_ttft_ms'], 2)} "
            f"| {fmt(level['median_tpot_ms'], 2)} | {fmt(level['p99_tpot_ms'], 2)} "
            f"| {fmt(level['median_itl_ms'], 2)} | {fmt(level['p99_itl_ms'], 2)} "
            f"| {fmt(level['median_e2el_ms'], 1)} | {fmt(level.get('mean_accepted_length'), 2)} |")


def write_csv(path, levels):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for level in levels:
            w.writerow({k: ("" if level.get(k) is None else level.get(k)) for k in CSV_FIELDS})


def compact_record(rec, req):
    """A request as saved in the JSON (seconds, rounded to microseconds)."""
    r6 = (lambda x: None if x is None else round(x, 6))
    return {"index": rec["index"], "max_tokens": req["max_tokens"], "group": req["group"],
            "start": r6(rec["start"]), "ttft": r6(rec["ttft"]),
            "e2el": r6(rec["e2el"]), "tpot": r6(rec.get("tpot")),
            "input_tokens": rec.get("input_tokens"), "output_tokens": rec.get("output_tokens"),
            "chunks": rec.get("chunks"), "itl": [r6(x) for x in rec.get("itl", [])],
            "cached_tokens": rec.get("cached_tokens"), "speculation": rec.get("speculation"),
            "error": rec["error"]}


# ----------------------------------------------------------------------------- run


def parse_goodput(items):
    slos = {}
    for item in items or []:
        key, _, value = item.partition(":")
        if key not in ("ttft", "tpot", "e2el") or not value:
            raise SystemExit(f"--goodput takes ttft:MS tpot:MS e2el:MS, got {item!r}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise SystemExit(f"--goodput {item!r}: {value!r} is not a number of milliseconds")
        if slos[key] < 0:
            raise SystemExit(f"--goodput {item!r}: the SLO must be >= 0 ms")
    return slos


def parse_list(text, kind, flag):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = kind(part)
        except ValueError:
            raise SystemExit(f"{flag}: {part!r} is not a number")
        if not v > 0:
            raise SystemExit(f"{flag}: {part!r} must be > 0")
        out.append(v)
    return out


def run_command(args):
    args.goodput = parse_goodput(args.goodput)
    try:
        args.extra_body = json.loads(args.extra_body)
    except ValueError as e:
        raise SystemExit(f"--extra-body is not JSON: {e}")
    if not 0 <= args.random_range_ratio < 1:
        raise SystemExit(f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
    if args.token_id_range:
        try:
            lo, hi = (int(x) for x in args.token_id_range.split(":"))
        except ValueError:
            lo, hi = 0, 0
        if not 0 <= lo < hi:
            raise SystemExit(f"--token-id-range must be LO:HI with 0 <= LO < HI, got "
                             f"'{args.token_id_range}'")
        args.token_id_range = (lo, hi)
    else:
        args.token_id_range = None
    if args.burstiness <= 0:
        raise SystemExit(f"--burstiness must be > 0, got {args.burstiness}")
    rates = parse_list(args.request_rate, float, "--request-rate") if args.request_rate else []
    concs = parse_list(args.concurrency, int, "--concurrency") if args.concurrency else []
    if not rates and not concs:
        rates = [math.inf]
    endpoint = Endpoint(args.base_url, args.api_key or os.environ.get("OPENAI_API_KEY", ""))
    model = args.model
    if not model:
        status, d = endpoint.request_json("GET", "/v1/models")
        if status != 200:
            raise SystemExit(f"GET /v1/models answered {status}: {str(d)[:200]}")
        model = d["data"][0]["id"]
    label = args.label or model
    reqs = build_requests(args, endpoint, model)
    print(f"[bench] {args.base_url} model {model}, {args.endpoint}, dataset {args.dataset}, "
          f"{len(reqs)} requests per level", file=sys.stderr)
    if args.warmup:
        warm = asyncio.run(run_level(args, endpoint, model, reqs[:args.warmup], concurrency=1))
        errors = [r["error"] for r in warm[0] if r["error"]]
        if errors:
            raise SystemExit(f"warm-up request failed: {errors[0]}")
    plan = [("open", r, None) for r in rates] + [("closed", None, c) for c in concs]
    levels = []
    print(table_header(), flush=True)
    for mode, rate, conc in plan:
        records, duration, wall_start = asyncio.run(
            run_level(args, endpoint, model, reqs, rate, conc))
        for rec, req in zip(records, reqs):
            if rec["error"] is None and rec["ttft"] is not None:
                finish_record(rec, req)
        level = {"label": label, "mode": mode,
                 "request_rate": None if rate is None else ("inf" if math.isinf(rate) else rate),
                 "burstiness": args.burstiness if mode == "open" else None,
                 "max_concurrency": args.max_concurrency if mode == "open" else None,
                 "concurrency": conc, "start_time": round(wall_start, 6)}
        level.update(level_metrics(args, records, duration))
        level["requests"] = [compact_record(r, q) for r, q in zip(records, reqs)]
        levels.append(level)
        print(table_row(level), flush=True)
        for e in level["errors"]:
            print(f"  error: {e}", file=sys.stderr)
    result = {"tool": "arbor scripts/bench_serve.py", "date": datetime.datetime.now().isoformat(
        timespec="seconds"), "base_url": args.base_url, "model": model, "label": label,
        "endpoint": args.endpoint, "dataset": args.dataset,
        "settings": {k: v for k, v in vars(args).items() if k not in ("func", "api_key")},
        "levels": levels}
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(result, f, indent=1)
    if args.result_csv:
        write_csv(args.result_csv, levels)
    if args.plot_dir:
        plot_results([result], [label], args.plot_dir)
    return 1 if any(level["completed"] == 0 for level in levels) else 0


# ----------------------------------------------------------------------------- plots


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        raise SystemExit("plots need matplotlib, which is not installed: "
                         "python3 -m pip install matplotlib (the benchmark itself runs without it)")


def _cdf(ax, values_ms, label):
    xs = sorted(values_ms)
    if xs:
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)


def plot_results(results, labels, out_dir):
    """Writes latency_throughput.png, ttft_cdf.png, itl_cdf.png and, for two or more results,
    comparison.png (output tok/s, TPOT and TTFT medians per level, side by side)."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    written = []
    # 1. Latency against throughput: a point per level, a curve per result and load mode
    # (open loop solid, closed loop dashed), in order of throughput.
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for k, (res, label) in enumerate(zip(results, labels)):
        color = f"C{k % 10}"
        for mode, style in (("open", "o-"), ("closed", "s--")):
            levels = sorted((lv for lv in res["levels"] if lv["completed"] and lv["mode"] == mode),
                            key=lambda lv: lv["output_throughput"])
            if not levels:
                continue
            xs = [lv["output_throughput"] for lv in levels]
            for ax, key in zip(axes, ("median_ttft_ms", "median_tpot_ms", "p99_e2el_ms")):
                ys = [lv[key] for lv in levels]
                ax.plot(xs, ys, style, color=color, label=f"{label} ({mode} loop)")
                for x, y, lv in zip(xs, ys, levels):
                    if y is not None:
                        ax.annotate(level_name(lv), (x, y), fontsize=7, xytext=(3, 3),
                                    textcoords="offset points")
    for ax, title in zip(axes, ("median TTFT (ms)", "median TPOT (ms)", "p99 end-to-end (ms)")):
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("latency against throughput, per load level")
    fig.tight_layout()
    path = os.path.join(out_dir, "latency_throughput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    # 2-3. CDFs of TTFT and ITL: one panel per load level, one curve per result.
    names = []
    for res in results:
        for lv in res["levels"]:
            if level_name(lv) not in names:
                names.append(level_name(lv))
    for metric, title in (("ttft", "TTFT"), ("itl", "inter-token latency (per chunk)")):
        cols = min(len(names), 4)
        rows = (len(names) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
        for k, name in enumerate(names):
            ax = axes[k // cols][k % cols]
            for res, label in zip(results, labels):
                for lv in res["levels"]:
                    if level_name(lv) != name:
                        continue
                    ok = [r for r in lv["requests"] if r["error"] is None and r["ttft"] is not None]
                    vals = ([r["ttft"] * 1e3 for r in ok] if metric == "ttft"
                            else [x * 1e3 for r in ok for x in r["itl"]])
                    _cdf(ax, vals, label)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel(f"{metric.upper()} (ms)")
            ax.set_ylabel("fraction of " + ("requests" if metric == "ttft" else "gaps"))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        for k in range(len(names), rows * cols):
            axes[k // cols][k % cols].axis("off")
        fig.suptitle(f"{title}: cumulative distribution")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{metric}_cdf.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    # 4. Side by side (speculation on vs off): bars per level.
    if len(results) >= 2:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        width = 0.8 / len(results)
        for j, (res, label) in enumerate(zip(results, labels)):
            by_name = {level_name(lv): lv for lv in res["levels"]}
            for ax, key in zip(axes, ("output_throughput", "median_tpot_ms", "median_ttft_ms")):
                ys = [(by_name[n].get(key) or 0) if n in by_name else 0 for n in names]
                bars = ax.bar([i + j * width for i in range(len(names))], ys, width, label=label)
                if key == "output_throughput":
                    for bar, n in zip(bars, names):
                        acc = by_name.get(n, {}).get("mean_accepted_length")
                        if acc is not None:
                            ax.annotate(f"{acc:.2f}", (bar.get_x() + bar.get_width() / 2,
                                                       bar.get_height()),
                                        ha="center", fontsize=7, xytext=(0, 2),
                                        textcoords="offset points")
        for ax, title in zip(axes, ("output tokens/s (label: accepted length)",
                                    "median TPOT (ms)", "median TTFT (ms)")):
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
            ax.set_xticklabels(names, rotation=30, fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=8)
        fig.suptitle(" vs ".join(labels))
        fig.tight_layout()
        path = os.path.join(out_dir, "comparison.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for path in written:
        print(f"[bench] wrote {path}", file=sys.stderr)
    return written


def plot_command(args):
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    labels = args.labels.split(",") if args.labels else [r.get("label") or os.path.basename(p)
                                                        for r, p in zip(results, args.results)]
    if len(labels) != len(results):
        raise SystemExit(f"--labels names {len(labels)} results, {len(results)} were given")
    plot_results(results, labels, args.out_dir)
    return 0


# ----------------------------------------------------------------------------- CLI


def merge_command(args):
    """One result from several runs of the same server (e.g. one run per concurrency, each
    with its own --num-prompts): the levels in the order given, the first run's header."""
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    merged = dict(results[0])
    merged["levels"] = [lv for res in results for lv in res["levels"]]
    merged["merged_from"] = [os.path.basename(p) for p in args.results]
    if args.label:
        merged["label"] = args.label
        for lv in merged["levels"]:
            lv["label"] = args.label
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)
    if args.csv:
        write_csv(args.csv, merged["levels"])
    return 0


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the benchmark (the default command)",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = run.add_argument_group("server")
    g.add_argument("--base-url", "--url", default="http://127.0.0.1:8000")
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions, streamed")
    g.add_argument("--model", default="", help="default: the first of /v1/models")
    g.add_argument("--api-key", default="", help="default: $OPENAI_API_KEY")
    g.add_argument("--timeout", type=float, default=600, help="seconds per request")
    g = run.add_argument_group("load")
    g.add_argument("--request-rate", default="",
                   help="open loop: comma-separated requests/s, 'inf' sends all at once "
                        "(default when --concurrency is not given: inf)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the arrival gaps: 1 Poisson, <1 burstier, >1 steadier")
    g.add_argument("--max-concurrency", type=int, default=0,
                   help="open loop: at most this many requests in flight (0: no cap)")
    g.add_argument("--concurrency", default="",
                   help="closed loop: comma-separated client counts, each sending back to back")
    g.add_argument("--num-prompts", type=int, default=0,
                   help="requests per load level (0: the dataset's size; random: 200)")
    g.add_argument("--warmup", type=int, default=1, help="untimed requests before the levels")
    g.add_argument("--seed", type=int, default=0, help="dataset sampling and arrival times")
    g = run.add_argument_group("dataset")
    g.add_argument("--dataset", choices=("mt-bench", "file", "random", "shared-prefix"),
                   default="mt-bench")
    g.add_argument("--dataset-path", default="",
                   help="mt-bench/file: JSONL ({turns}, {prompt} or {text}) or text, one per line; "
                        "random/shared-prefix: the corpus for token ids and words "
                        f"(default {os.path.relpath(DEFAULT_PROMPTS)})")
    g.add_argument("--max-tokens", type=int, default=128, help="mt-bench/file output length")
    g.add_argument("--random-input-len", type=int, default=1024)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]")
    g.add_argument("--token-id-range", default="", metavar="LO:HI",
                   help="random/shared-prefix over completions: prompt ids uniform in [LO, HI) "
                        "instead of the server's /tokenize pool (servers without a tokenizer, "
                        "e.g. arbor's dummy:llama-3-8b)")
    g.add_argument("--gsp-num-groups", type=int, default=64)
    g.add_argument("--gsp-prompts-per-group", type=int, default=16)
    g.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    g.add_argument("--gsp-question-len", type=int, default=128)
    g.add_argument("--gsp-output-len", type=int, default=256)
    g = run.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed-requests", action="store_true", help="send --seed in every request")
    g.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (vLLM, SGLang, arbor): every request runs to max_tokens")
    g.add_argument("--extra-body", default="{}",
                   help='JSON merged into every request, e.g. \'{"speculate": false}\'')
    g = run.add_argument_group("results")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs for goodput: ttft:MS tpot:MS e2el:MS (a request is good when it "
                        "meets all)")
    g.add_argument("--label", default="", help="names this run in tables and plots")
    g.add_argument("--result-json", default="", help="levels, settings and every request")
    g.add_argument("--result-csv", default="", help="one row per level")
    g.add_argument("--plot-dir", default="", help="also draw this run's plots (matplotlib)")
    run.set_defaults(func=run_command)
    plot = sub.add_parser("plot", help="PNG plots from one or more result JSONs")
    plot.add_argument("results", nargs="+", help="--result-json files")
    plot.add_argument("--labels", default="", help="comma-separated, one per result")
    plot.add_argument("--out-dir", default="bench_plots")
    plot.set_defaults(func=plot_command)
    merge = sub.add_parser("merge", help="join result JSONs of one server into one (levels in "
                                         "order), e.g. runs with a --num-prompts per level")
    merge.add_argument("results", nargs="+", help="--result-json files")
    merge.add_argument("--out", required=True, help="the joined JSON")
    merge.add_argument("--csv", default="", help="also its levels as CSV")
    merge.add_argument("--label", default="", help="relabel every level")
    merge.set_defaults(func=merge_command)
    return ap


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "plot", "merge", "-h", "--help"):
        argv.insert(0, "run")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
