#!/usr/bin/env python3
"""Builds a frequency-ranked draft vocabulary ("token map", as SGLang's
`--speculative-token-map` and FR-Spec) for an EAGLE-1/2 draft: the model's own replies to
instructions that are not the measuring prompts, counted token by token, most frequent first.

The draft then scores only those rows of the target's LM head (docs/speculation.md, "A reduced
draft vocabulary"); speculation stays lossless because the target verifies every token, and a
reply token outside the map can only be accepted as the target's own next token.

Two phases:
  gen    send every prompt's first turn as one chat message (plain text lines: as completion
         prompts) to a running arbor server, greedy, and write the replies as JSONL {"id",
         "text", "ids" (the reply through the server's /tokenize), "finish"}; resumable
         (replies already in --replies are skipped); standard library only;
  count  count the replies' token ids (and an end token per finished reply), write the map.

  arbor serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8011 --max-running 64 &
  python3 scripts/make_instruction_prompts.py --n 3000 --out /tmp/fr/instructions.jsonl \\
      --outside-out /tmp/fr/outside.jsonl
  python3 scripts/make_token_map.py gen --url http://127.0.0.1:8011/v1 \\
      --prompts /tmp/fr/instructions.jsonl --replies /tmp/fr/replies.jsonl
  python3 scripts/make_token_map.py count --replies /tmp/fr/replies.jsonl \\
      --vocab-size 49152 --eos-id 2 --size 16384 \\
      --out tests/data/heads/smollm2/eagle/token_map.json

The map file: {"token_ids": [...], "source": ..., "coverage": {...}} with the ids most frequent
first (ties by id); arbor reads its first --spec-draft-vocab entries (all by default).
"""
import argparse
import collections
import concurrent.futures
import json
import os
import sys
import threading
import urllib.request


def load_prompts(path):
    """(id, text, chat): MT-bench-schema JSONL lines ({"question_id", "turns"}) are chat
    messages; any other line is a raw completion prompt (a base model's)."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
            except json.JSONDecodeError:
                o = None
            if isinstance(o, dict) and "turns" in o:
                out.append((str(o["question_id"]), o["turns"][0], True))
            else:
                out.append((str(i), line.rstrip("\n"), False))
    return out


def post(url, body, api_key):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + api_key})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def gen(args):
    base = args.url.rstrip("/")
    model = args.model
    if not model:
        with urllib.request.urlopen(base + "/models", timeout=60) as r:
            model = json.loads(r.read())["data"][0]["id"]
    done = set()
    if os.path.exists(args.replies):
        with open(args.replies) as f:
            done = {json.loads(line)["id"] for line in f if line.strip()}
    todo = [p for p in load_prompts(args.prompts) if p[0] not in done]
    if args.limit:
        todo = todo[: max(0, args.limit - len(done))]
    print(f"[gen] {len(done)} replies present, {len(todo)} to go", flush=True)
    lock = threading.Lock()
    out = open(args.replies, "a")

    def one(p):
        body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0}
        if p[2]:
            body["messages"] = [{"role": "user", "content": p[1]}]
        else:
            body["prompt"] = p[1]
        r = post(base + ("/chat/completions" if p[2] else "/completions"), body, args.api_key)
        choice = r["choices"][0]
        text = (choice["message"]["content"] if p[2] else choice["text"]) or ""
        # The reply's token ids from the server's own tokenizer (arbor's /tokenize, as vLLM's).
        ids = post(base.rsplit("/v1", 1)[0] + "/tokenize",
                   {"prompt": text, "add_special_tokens": False}, args.api_key)["tokens"]
        with lock:
            out.write(json.dumps({"id": p[0], "text": text, "ids": ids,
                                  "finish": choice["finish_reason"]}) + "\n")
            out.flush()
        return r["usage"]["completion_tokens"]

    n = tokens = 0
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        for t in pool.map(one, todo):
            n += 1
            tokens += t
            if n % 500 == 0:
                print(f"[gen] {n}/{len(todo)} replies, {tokens} tokens", flush=True)
    out.close()
    print(f"[gen] done: {n} replies, {tokens} tokens", flush=True)


def count(args):
    counts = collections.Counter()
    replies = 0
    with open(args.replies) as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            counts.update(o["ids"])
            if o.get("finish") == "stop":
                counts[args.eos_id] += 1  # the reply's end token is drafted too
            replies += 1
    total = sum(counts.values())
    ranked = sorted(counts, key=lambda i: (-counts[i], i))
    vocab = args.vocab_size
    if len(ranked) < args.size:  # pad with the unseen ids, lowest first: a map has --size ids
        seen = set(ranked)
        ranked += [i for i in range(vocab) if i not in seen][: args.size - len(ranked)]
    ranked = ranked[: args.size]

    def coverage(n):
        return sum(counts[i] for i in ranked[:n]) / total

    cov = {str(n): round(coverage(n), 4) for n in (1024, 2048, 4096, 8192, 16384, 32768)
           if n <= args.size}
    doc = {"token_ids": ranked,
           "source": {"replies": replies, "tokens": total, "distinct": len(counts),
                      "vocab_size": vocab},
           "coverage": cov}
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"[count] {replies} replies, {total} tokens, {len(counts)} distinct; "
          f"coverage of the first N ids: {cov}; wrote {args.out}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="phase", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--url", required=True)
    g.add_argument("--api-key", default="none")
    g.add_argument("--model", default="", help="default: the server's first model")
    g.add_argument("--prompts", required=True)
    g.add_argument("--replies", required=True)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--concurrency", type=int, default=64)
    g.add_argument("--limit", type=int, default=0, help="replies in all (0: every prompt)")
    c = sub.add_parser("count")
    c.add_argument("--replies", required=True)
    c.add_argument("--vocab-size", type=int, required=True)
    c.add_argument("--eos-id", type=int, required=True)
    c.add_argument("--size", type=int, default=8192)
    c.add_argument("--out", required=True)
    args = ap.parse_args()
    gen(args) if args.phase == "gen" else count(args)


if __name__ == "__main__":
    sys.exit(main())
