"""`arbor serve --backend cuda` on the GPU machine (standard library only: the device has no
openai / grpcio packages): greedy completions with EAGLE speculation equal plain greedy on the
same GPU server, 32 concurrent streams equal the same prompts alone, a disconnect storm leaves
zero KV blocks in use, and a small load test (plain vs speculation; docs/performance.md
"Serving").

  ARBOR_BIN=/tmp/arbor_gpu/arbor python3 tests/server/gpu_smoke.py MODEL HEADS [--spec eagle]
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ArborServer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import bench_serve  # noqa: E402


def post(port, body):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    d = json.loads(r.read())
    c.close()
    return r.status, d


def main():
    model, heads = sys.argv[1], sys.argv[2]
    method = sys.argv[3] if len(sys.argv) > 3 else "eagle"
    prompts_file = sys.argv[4] if len(sys.argv) > 4 else "scripts/data/story_openers.txt"
    failures = []
    prompts = bench_serve.load_prompts(prompts_file)[:16]
    with ArborServer(["--backend", "cuda", "--spec", method, "--spec-heads", heads,
                      "--spec-adaptive", "false", "--kv-blocks", "8192"], model=model,
                     grpc=False) as srv:
        port = srv.port
        spec, plain = [], []
        for p in prompts:
            s, a = post(port, {"prompt": p, "max_tokens": 64, "temperature": 0})
            s2, b = post(port, {"prompt": p, "max_tokens": 64, "temperature": 0,
                                "speculate": False})
            assert s == 200 and s2 == 200, (a, b)
            spec.append(a)
            plain.append(b)
        same = sum(a["choices"][0]["text"] == b["choices"][0]["text"] for a, b in zip(spec, plain))
        steps = sum(a["usage"]["speculation"]["decode_steps"] for a in spec)
        toks = sum(a["usage"]["speculation"]["mean_accepted_length"] *
                   a["usage"]["speculation"]["decode_steps"] for a in spec)
        print(f"speculative greedy == plain greedy on the GPU: {same}/{len(prompts)}; "
              f"mean accepted length {toks / max(steps, 1):.2f}")
        if same != len(prompts):
            for a, b in zip(spec, plain):
                if a["choices"][0]["text"] != b["choices"][0]["text"]:
                    print("  differs:", repr(a["choices"][0]["text"][:80]), "vs",
                          repr(b["choices"][0]["text"][:80]))
            failures.append("lossless")
        # 32 concurrent streams == alone (plain greedy).
        results = [None] * 32

        def run(i):
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": 64, "temperature": 0,
                    "speculate": False}
            results[i] = post(port, body)[1]["choices"][0]["text"]

        ts = [threading.Thread(target=run, args=(i,)) for i in range(32)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        ok = sum(results[i] == plain[i % len(prompts)]["choices"][0]["text"] for i in range(32))
        print(f"32 concurrent == alone: {ok}/32")
        if ok != 32:
            failures.append("concurrent")
        # Disconnect storm.
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "stream": True,
                           "ignore_eos": True, "temperature": 0.8}).encode()
        socks = []
        for _ in range(32):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body)
            socks.append(s)
        for s in socks:
            got = b""
            while b"data:" not in got:
                got += s.recv(4096)
        for s in socks:
            s.close()
        time.sleep(3)
        m = srv.metrics()
        print(f"after disconnect storm: kv blocks used {m['arbor_kv_blocks_used']:.0f}, "
              f"running {m['arbor_running_sequences']:.0f}")
        if m["arbor_kv_blocks_used"] != 0:
            failures.append("disconnect")
    print("FAILURES:", failures if failures else "none")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
