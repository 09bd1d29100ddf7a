"""`arbor serve` as clients use it: a real server process on loopback, driven by the official
`openai` Python client and by raw HTTP. References from outside the server: Hugging Face
transformers' greedy tokens for stories260K (tests/data/golden), Python jinja2 rendering the
SmolLM2 GGUF's own chat template, and the same prompts run alone.

Run: ARBOR_BIN=build/server/arbor ARBOR_SHARED_DIR=../shared python3 tests/server/test_openai.py
"""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import unittest
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ArborServer, STORIES, raw, tok512_pieces  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
SMOLLM2 = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GOLDEN = os.path.join(REPO, "tests", "data", "golden", "stories260K.json")
CHATML = os.path.join(REPO, "tests", "data", "chat_templates", "smollm2.jinja")


def tok512_decode(ids):
    """Decodes stories260K ids with llama2.c's tokenizer file (tok512.bin), as run.c does."""
    vocab = tok512_pieces()
    out = b""
    prev = 1
    for t in ids:
        piece = vocab[t]
        if prev == 1 and piece.startswith(b" "):
            piece = piece[1:]
        if piece.startswith(b"<0x") and piece.endswith(b">") and len(piece) == 6:
            piece = bytes([int(piece[3:5], 16)])
        out += piece
        prev = t
    return out.decode("utf-8", errors="replace")


class StoriesServer(unittest.TestCase):
    """stories260K, plain decoding, a ChatML template given on the command line."""

    @classmethod
    def setUpClass(cls):
        cls.srv = ArborServer(["--kv-blocks", "512", "--max-running", "64",
                               "--chat-template", CHATML, "--max-body-bytes", "65536"],
                              grpc=False).start()
        cls.client = openai.OpenAI(base_url=cls.srv.base_url + "/v1", api_key="unused",
                                   max_retries=0, timeout=120)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        code = cls.srv.stop()
        assert code == 0, f"server exited with {code}:\n{cls.srv.output()}"

    def complete(self, prompt, n_tokens=24, **kw):
        return self.client.completions.create(model=self.model, prompt=prompt,
                                              max_tokens=n_tokens, temperature=0, **kw)

    def test_greedy_equals_transformers(self):
        with open(GOLDEN) as f:
            golden = json.load(f)
        r = self.complete([1], n_tokens=60, extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, tok512_decode(golden["greedy_tokens"][:60]))
        self.assertEqual(r.usage.prompt_tokens, 1)
        self.assertEqual(r.usage.completion_tokens, 60)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_a_reused_connection_answers_without_a_nagle_stall(self):
        """The openai client keeps its connection alive between requests. A server that writes
        a response in several small writes with Nagle's algorithm on waits for the client's
        delayed acknowledgement (40 ms on Linux) on every request after the first: 42-44 ms
        for a 4-token completion that takes 1 ms (measured before TCP_NODELAY)."""
        c = openai.OpenAI(base_url=self.srv.base_url + "/v1", api_key="unused", max_retries=0,
                          timeout=120)
        for stream in (False, True):
            times = []
            for _ in range(12):
                t = time.perf_counter()
                r = c.completions.create(model=self.model, prompt="Once", max_tokens=2,
                                         stream=stream)
                if stream:
                    list(r)
                times.append(time.perf_counter() - t)
            times.sort()
            self.assertLess(times[6], 0.025, f"stream={stream}: {times}")
        c.close()

    def test_streaming_equals_non_streaming(self):
        full = self.complete("Once upon a time", 40).choices[0].text
        parts, reasons = [], []
        for chunk in self.client.completions.create(model=self.model, prompt="Once upon a time",
                                                    max_tokens=40, temperature=0, stream=True):
            parts.append(chunk.choices[0].text)
            reasons.append(chunk.choices[0].finish_reason)
        self.assertEqual("".join(parts), full)
        self.assertEqual(reasons[-1], "length")
        self.assertGreater(len(parts), 10)

    def test_chat_streaming_and_usage(self):
        msgs = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about a cat."}]
        r = self.client.chat.completions.create(model=self.model, messages=msgs, max_tokens=20,
                                                temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        text = r.choices[0].message.content
        stream = self.client.chat.completions.create(
            model=self.model, messages=msgs, max_tokens=20, temperature=0, stream=True,
            stream_options={"include_usage": True})
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                         text)
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, r.usage.prompt_tokens)

    def test_n_samples_and_seed(self):
        greedy = self.complete("The dog", 16).choices[0].text
        r = self.client.completions.create(model=self.model, prompt="The dog", max_tokens=16,
                                           temperature=0, n=3)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        self.assertEqual([c.text for c in r.choices], [greedy] * 3)
        one = self.complete("The dog", 2).usage.prompt_tokens
        self.assertEqual(r.usage.prompt_tokens, one)  # counted once for all choices
        a = self.client.completions.create(model=self.model, prompt="The dog", max_tokens=24,
                                           temperature=1.0, n=4, seed=7)
        b = self.client.completions.create(model=self.model, prompt="The dog", max_tokens=24,
                                           temperature=1.0, n=4, seed=7)
        self.assertEqual([c.text for c in a.choices], [c.text for c in b.choices])
        self.assertGreater(len({c.text for c in a.choices}), 1, "choices should differ")
        # Batched prompts: choices are prompt-major.
        r = self.client.completions.create(model=self.model, prompt=["The dog", "The cat"],
                                           max_tokens=8, temperature=0, n=2)
        self.assertEqual(len(r.choices), 4)
        self.assertEqual(r.choices[0].text, r.choices[1].text)
        self.assertEqual(r.choices[0].text, self.complete("The dog", 8).choices[0].text)
        self.assertEqual(r.choices[2].text, self.complete("The cat", 8).choices[0].text)

    def test_stop_strings_and_logprobs(self):
        full = self.complete("Once upon a time", 40).choices[0].text
        cut = full.index(" a ", 5) if " a " in full[5:] else None
        self.assertIsNotNone(cut)
        r = self.complete("Once upon a time", 40, stop=[" a "])
        self.assertEqual(r.choices[0].text, full[:cut])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        r = self.complete("Once upon a time", 6, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual("".join(lp.tokens).lstrip(" "), r.choices[0].text.lstrip(" "))
        for tok, lpv, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(lpv, 0.0)
            self.assertEqual(len(top), 3)
            self.assertAlmostEqual(max(top.values()), lpv, places=5)  # greedy = the best
        c = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            temperature=0, logprobs=True, top_logprobs=2)
        content = c.choices[0].logprobs.content
        self.assertEqual(len(content), 5)
        self.assertEqual(len(content[0].top_logprobs), 2)

    def test_errors_with_the_openai_client(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete("Once", -1)
        self.assertIn("max_tokens", str(e.exception))
        with self.assertRaises(openai.BadRequestError):
            self.complete("Once", 10**9)
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete("Once upon a time " * 200, 10)
        self.assertIn("context", str(e.exception))
        with self.assertRaises(openai.NotFoundError):
            self.client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model=self.model, prompt="x", max_tokens=2,
                                           temperature=5)
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model=self.model, messages=[], max_tokens=2)
        # Still serving.
        self.assertEqual(self.complete("Once", 4).usage.completion_tokens, 4)

    def test_malformed_requests_get_4xx_json(self):
        port = self.srv.port
        cases = [
            (b"{not json", 400),
            (json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), 400),
            (json.dumps({"prompt": 5}).encode(), 400),
            (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400),
            (json.dumps({"prompt": "x", "n": 0}).encode(), 400),
            (json.dumps({"prompt": "x", "stop": 3}).encode(), 400),
            (json.dumps({"prompt": [1, 2, 99999]}).encode(), 400),
            (json.dumps({"prompt": "x", "max_tokens": -5}).encode(), 400),
            (json.dumps({"prompt": "x", "max_tokens": 2**40}).encode(), 400),
            (b'{"prompt": "\xff\xfe invalid utf-8"}', 400),
            (json.dumps({"prompt": "x", "model": "gpt-4"}).encode(), 404),
            (json.dumps([1, 2, 3]).encode(), 400),
            (json.dumps({"prompt": "x" * 70000}).encode(), 413),
        ]
        for body, status in cases:
            code, resp = raw(port, "POST", "/v1/completions", body,
                             {"Content-Type": "application/json"})
            self.assertEqual(code, status, (body[:60], resp))
            self.assertIsInstance(resp, dict, body[:60])
            self.assertIn("message", resp["error"])
            self.assertIn("type", resp["error"])
        code, resp = raw(port, "GET", "/v1/nothing-here")
        self.assertEqual(code, 404)
        self.assertIn("error", resp)
        code, resp = raw(port, "POST", "/v1/chat/completions",
                         json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
                         {"Content-Type": "application/json"})
        self.assertEqual(code, 400)
        self.assertEqual(resp["error"]["param"], "messages[0].role")
        self.assertEqual(self.complete("Once", 3).usage.completion_tokens, 3)

    def test_concurrent_streams_equal_alone(self):
        prompts = [f"Once upon a time there was a {w}" for w in
                   ["dog", "cat", "bird", "girl", "boy", "tree", "car", "ball"]] * 8
        alone = {}
        for p in set(prompts):
            alone[p] = self.complete(p, 24).choices[0].text
        results = [None] * len(prompts)
        errors = []

        def run(i):
            try:
                client = openai.OpenAI(base_url=self.srv.base_url + "/v1", api_key="x",
                                       max_retries=0, timeout=300)
                text = ""
                for ch in client.completions.create(model=self.model, prompt=prompts[i],
                                                    max_tokens=24, temperature=0, stream=True):
                    text += ch.choices[0].text
                results[i] = text
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(prompts), 64)
        for p, r in zip(prompts, results):
            self.assertEqual(r, alone[p], p)

    def test_disconnect_storm_frees_every_block(self):
        socks = []
        # 32 x 4 choices x 480 tokens: seconds of work, so they are all running when cut.
        body = json.dumps({"prompt": "Once", "max_tokens": 480, "stream": True, "n": 4,
                           "ignore_eos": True, "temperature": 0.8}).encode()
        base = self.srv.metrics()
        for _ in range(32):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
            socks.append(s)
        for s in socks:
            got = b""
            while b"data:" not in got:  # the stream has started producing tokens
                got += s.recv(4096)
        for s in socks:
            s.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            m = self.srv.metrics()
            if m["arbor_kv_blocks_used"] == 0 and m["arbor_running_sequences"] == 0:
                break
            time.sleep(0.2)
        self.assertEqual(m["arbor_kv_blocks_used"], 0)
        self.assertEqual(m["arbor_running_sequences"], 0)
        # Every request ended, most of them cancelled by the disconnects (under a slow build
        # some finish their 480 tokens while the test waits for the others' first tokens).
        def delta(status):
            key = 'arbor_requests_total{status="%s"}' % status
            return m.get(key, 0) - base.get(key, 0)
        self.assertEqual(delta("cancelled") + delta("ok"), 32)
        self.assertGreaterEqual(delta("cancelled"), 8)
        self.assertEqual(self.complete("Once", 3).usage.completion_tokens, 3)

    def test_a_request_is_counted_before_its_response_ends(self):
        # Once a client has read the whole response (plain or streamed), /metrics counts it.
        key = 'arbor_requests_total{status="ok"}'
        for i in range(12):
            before = self.srv.metrics().get(key, 0)
            if i % 2:
                text = "".join(ch.choices[0].text for ch in self.complete("Once", 3, stream=True))
                self.assertTrue(text)
            else:
                self.assertEqual(self.complete("Once", 3).usage.completion_tokens, 3)
            self.assertEqual(self.srv.metrics().get(key, 0), before + 1)

    def test_metrics_and_models(self):
        self.complete("Once", 5)
        m = self.srv.metrics()
        self.assertGreater(m["arbor_time_to_first_token_seconds_count"], 0)
        self.assertGreater(m["arbor_time_per_output_token_seconds_count"], 0)
        self.assertGreater(m["arbor_generation_tokens_total"], 0)
        self.assertGreater(m["arbor_kv_blocks_total"], 0)
        self.assertIn("arbor_queue_depth", m)
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].id, "stories260K.bin")


class SpeculatingServer(unittest.TestCase):
    """stories260K with its trained EAGLE heads: lossless, and usage reports the speculation."""

    def test_eagle_greedy_equals_plain_and_reports_acceptance(self):
        heads = os.path.join(REPO, "tests", "data", "heads", "stories260K", "eagle")
        prompts = ["Once upon a time", "Lily and Ben", "The little dog was sad because"]
        with ArborServer(["--spec", "eagle", "--spec-heads", heads, "--spec-adaptive", "false"],
                         grpc=False) as srv:
            c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
            spec = [c.completions.create(model="stories260K.bin", prompt=p, max_tokens=64,
                                         temperature=0) for p in prompts]
            off = [c.completions.create(model="stories260K.bin", prompt=p, max_tokens=64,
                                        temperature=0, extra_body={"speculate": False})
                   for p in prompts]
            m = srv.metrics()
        for s, o in zip(spec, off):
            self.assertEqual(s.choices[0].text, o.choices[0].text)
            sp = s.usage.model_extra["speculation"]
            self.assertGreater(sp["mean_accepted_length"], 1.5)
            self.assertGreater(sp["accepted_draft_tokens"], 0)
            self.assertEqual(o.usage.model_extra["speculation"]["accepted_draft_tokens"], 0)
        self.assertGreater(m['arbor_spec_draft_accepted_total{depth="1"}'], 0)
        self.assertGreater(m["arbor_spec_verify_steps_total"], 0)
        self.assertGreater(m["arbor_spec_draft_seconds_total"], 0)
        self.assertGreater(m["arbor_spec_feedback_seconds_total"], 0)
        self.assertGreater(m['arbor_engine_step_seconds_total{phase="decode"}'], 0)
        self.assertIn("arbor_spec_speculating_sequences", m)
        self.assertIn('arbor_step_graphs_total{outcome="replay"}', m)

    def test_eagle_token_map_from_the_config_file(self):
        """speculation.token_map / draft_vocab in the YAML: the draft vocabulary is logged,
        greedy output equals plain; a missing map stops the server with the file named."""
        import subprocess
        import tempfile
        from arbor_server import ARBOR_BIN
        heads = os.path.join(REPO, "tests", "data", "heads", "stories260K", "eagle")
        with tempfile.TemporaryDirectory() as d:
            tmap = os.path.join(d, "map.json")
            with open(tmap, "w") as f:
                json.dump({"token_ids": list(range(511, -1, -2))}, f)  # 256 odd ids, high first
            config = os.path.join(d, "c.yaml")
            with open(config, "w") as f:
                f.write("speculation:\n  method: eagle\n  heads: %s\n  adaptive: false\n"
                        "  token_map: %s\n  draft_vocab: 200\n" % (heads, tmap))
            with ArborServer(["--config", config], grpc=False) as srv:
                self.assertIn("EAGLE draft vocabulary: 200 of 512 target ids (token map %s)"
                              % tmap, srv.output())
                self.assertIn("token_map: " + tmap, srv.output())  # the echoed configuration
                c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
                for p in ["Once upon a time", "The little dog was sad because"]:
                    spec = c.completions.create(model="stories260K.bin", prompt=p, max_tokens=48,
                                                temperature=0)
                    off = c.completions.create(model="stories260K.bin", prompt=p, max_tokens=48,
                                               temperature=0, extra_body={"speculate": False})
                    self.assertEqual(spec.choices[0].text, off.choices[0].text)
            missing = os.path.join(d, "nope.json")
            r = subprocess.run([ARBOR_BIN, "serve", "--model", STORIES, "--port", "0",
                                "--grpc-port", "0", "--spec", "eagle", "--spec-heads", heads,
                                "--spec-token-map", missing], capture_output=True, text=True,
                               timeout=120)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(missing, r.stderr)
            self.assertIn("not found", r.stderr)

    def test_spec_override_rejected_without_a_proposer(self):
        with ArborServer([], grpc=False) as srv:
            code, resp = raw(srv.port, "POST", "/v1/completions",
                             json.dumps({"prompt": "x", "speculate": True}))
            self.assertEqual(code, 400)
            self.assertEqual(resp["error"]["param"], "speculate")


class Operations(unittest.TestCase):
    def test_api_key(self):
        with ArborServer(["--api-key", "s3cret"], grpc=False) as srv:
            bad = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="wrong", max_retries=0)
            with self.assertRaises(openai.AuthenticationError):
                bad.completions.create(model="stories260K.bin", prompt="x", max_tokens=2)
            code, _ = raw(srv.port, "POST", "/v1/completions", json.dumps({"prompt": "x"}))
            self.assertEqual(code, 401)
            good = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="s3cret", max_retries=0)
            r = good.completions.create(model="stories260K.bin", prompt="x", max_tokens=2)
            self.assertEqual(r.usage.completion_tokens, 2)
            self.assertEqual(raw(srv.port, "GET", "/health")[0], 200)  # health stays open

    def test_full_queue_answers_429(self):
        with ArborServer(["--max-running", "1", "--max-queue", "1"], grpc=False) as srv:
            statuses = []
            lock = threading.Lock()

            def run():
                code, _ = raw(srv.port, "POST", "/v1/completions",
                              json.dumps({"prompt": "Once", "max_tokens": 480,
                                          "ignore_eos": True}))
                with lock:
                    statuses.append(code)

            threads = [threading.Thread(target=run) for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertIn(429, statuses)
            self.assertIn(200, statuses)
            self.assertEqual(set(statuses), {200, 429})
            c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
            self.assertEqual(c.completions.create(model="stories260K.bin", prompt="x",
                                                  max_tokens=2).usage.completion_tokens, 2)

    def test_sigterm_drains_running_requests(self):
        srv = ArborServer([], grpc=False).start()
        result = {}

        def run():
            result["r"] = raw(srv.port, "POST", "/v1/completions",
                              json.dumps({"prompt": "Once", "max_tokens": 300,
                                          "ignore_eos": True}))

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        # While draining, /health answers 503. The drain may already be over (a loaded machine,
        # a sanitizer build) and the listener closing: a refused or reset connection then.
        code_during = None
        if srv.proc.poll() is None:
            try:
                code_during = raw(srv.port, "GET", "/health", timeout=10)[0]
            except (ConnectionError, http.client.HTTPException):
                pass
        t.join()
        self.assertEqual(srv.proc.wait(60), 0, srv.output())
        code, body = result["r"]
        self.assertEqual(code, 200)
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"]["completion_tokens"], 300)
        if code_during is not None:
            self.assertEqual(code_during, 503)

    def _stream_unread(self, port):
        """A streamed completion on a socket with a 4 KiB receive buffer whose client reads
        only the first bytes: the rest waits in the server's send buffer, unacknowledged."""
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        body = json.dumps({"prompt": "Once", "max_tokens": 200, "n": 2, "stream": True,
                           "ignore_eos": True})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        return s, s.recv(512)

    def _wait_engine_idle(self, srv):
        """Until the draining engine runs nothing (its responses then only wait to be read)."""
        deadline, draining = time.time() + 60, False
        while time.time() < deadline:
            code = raw(srv.port, "GET", "/health")[0]
            # 200 until the signal is handled, 503 from then on
            self.assertIn(code, (503,) if draining else (200, 503))
            draining = code == 503
            if draining and srv.metrics()["arbor_running_sequences"] == 0:
                return
            time.sleep(0.05)
        self.fail("the engine kept running sequences")

    def test_sigterm_waits_until_the_client_has_the_stream(self):
        """The drain ends once the clients' TCP has acknowledged the responses' bytes, not once
        the server has written them into its own socket buffers: a process that exits then (in
        a container, with its network namespace) loses what the clients had not received yet
        (seen in the image test: a stream's last chunks lost through podman's NAT)."""
        srv = ArborServer([], grpc=False).start()
        s, head = self._stream_unread(srv.port)
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        srv.proc.send_signal(signal.SIGTERM)
        self._wait_engine_idle(srv)
        time.sleep(1.0)
        self.assertIsNone(srv.proc.poll(), "the server exited with the stream still unread: "
                          + srv.output())
        self.assertEqual(raw(srv.port, "GET", "/health")[0], 503)  # still draining
        data = head
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        self.assertEqual(srv.proc.wait(60), 0, srv.output())
        text = data.decode()
        self.assertTrue(text.endswith("data: [DONE]\n\n\r\n0\r\n\r\n"), text[-200:])
        events = [json.loads(line[len("data: "):]) for line in text.split("\n")
                  if line.startswith("data: {")]
        finish = {c["index"]: c["finish_reason"] for e in events for c in e["choices"]
                  if c["finish_reason"]}
        self.assertEqual(finish, {0: "length", 1: "length"})

    def test_drain_deadline_bounds_a_client_that_never_reads(self):
        srv = ArborServer(["--drain-timeout", "2"], grpc=False).start()
        s, head = self._stream_unread(srv.port)
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        self.assertEqual(srv.proc.wait(30), 0, srv.output())
        self.assertLess(time.time() - t0, 10)
        s.close()
        self.assertIn("drain deadline (2 s) reached with 1 HTTP response(s) not yet received",
                      srv.output())

    def test_config_file_and_bad_values(self):
        import subprocess
        import tempfile
        from arbor_server import ARBOR_BIN
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("model:\n  path: %s\nengine:\n  kv_blocks: 300\nserver:\n  port: 0\n"
                    "  grpc_port: 0\n" % STORIES)
            good = f.name
        with ArborServer(["--config", good], grpc=False) as srv:
            self.assertIn("kv_blocks: 300", srv.output())  # echoed at start-up
            self.assertEqual(srv.metrics()["arbor_kv_blocks_total"], 300)
        for text, needle in [("engine:\n  kv_blocks: -3\n", "engine.kv_blocks"),
                             ("engine:\n  kv_blok: 3\n", "engine.kv_blok"),
                             ("server:\n  port: many\n", "server.port"),
                             ("speculation:\n  method: magic\n", "speculation.method")]:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write("model:\n  path: %s\n" % STORIES + text)
            p = subprocess.run([ARBOR_BIN, "serve", "--config", f.name], capture_output=True,
                               text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(needle, p.stderr)

    def test_kv_cache_sized_from_memory_and_too_large_is_a_clear_error(self):
        """Without --kv-blocks the cache is sized from the memory there is (on the CPU capped at
        max_running full contexts: 4 x 512 / 16 = 128 blocks for stories260K), logged at
        start-up and exported; a cache larger than the memory is an error naming the sizes."""
        import re
        import subprocess
        from arbor_server import ARBOR_BIN
        with ArborServer(["--max-running", "4"], grpc=False) as srv:
            self.assertEqual(srv.metrics()["arbor_kv_blocks_total"], 128)
            line = re.search(r"KV cache: .*", srv.output())
            self.assertIsNotNone(line, srv.output())
            self.assertIn("128 blocks x 16 tokens = 2048 tokens", line.group(0))
            self.assertIn("4.0 requests of the full 512-token context", line.group(0))
            self.assertIn("gpu_memory_utilization: 0.9", srv.output())  # echoed configuration
        p = subprocess.run([ARBOR_BIN, "serve", "--model", STORIES, "--port", "0",
                            "--grpc-port", "0", "--kv-blocks", "16000000", "--block-size", "1024"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("a KV cache of 16000000 blocks of 1024 tokens needs 19.1 TiB", p.stderr)
        self.assertIn("of host memory is free", p.stderr)
        self.assertNotIn("bad_alloc", p.stderr)
        p = subprocess.run([ARBOR_BIN, "serve", "--model", STORIES, "--port", "0",
                            "--gpu-memory-utilization", "1.5"], capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("engine.gpu_memory_utilization", p.stderr)

    def test_tensor_parallel_serves_the_same_tokens_and_refuses_bad_splits(self):
        """--tensor-parallel 2 (the CPU group: a thread per rank): greedy completions equal the
        single-backend server's; a split the model cannot take stops start-up with the reason."""
        import subprocess
        import openai
        from arbor_server import ARBOR_BIN
        prompts = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]
        texts = {}
        for tp in (1, 2):
            with ArborServer(["--tensor-parallel", str(tp)], grpc=False) as srv:
                client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
                model = client.models.list().data[0].id
                texts[tp] = [client.completions.create(model=model, prompt=p,
                                                       max_tokens=64, temperature=0).choices[0].text
                             for p in prompts]
                if tp == 2:
                    self.assertIn("tensor_parallel: 2", srv.output())
        self.assertEqual(texts[2], texts[1])
        self.assertTrue(all(len(t) > 50 for t in texts[1]), texts[1])
        p = subprocess.run([ARBOR_BIN, "serve", "--model", STORIES, "--port", "0",
                            "--grpc-port", "0", "--tensor-parallel", "3"], capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("tensor parallel size 3: num_heads 8 is not divisible by 3", p.stderr)


class SmolLM2Chat(unittest.TestCase):
    """The default model with the chat template from its GGUF, against Python jinja2."""

    def test_chat_equals_completion_of_the_jinja2_rendering(self):
        import gguf
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        reader = gguf.GGUFReader(SMOLLM2)
        field = reader.fields["tokenizer.chat_template"]
        template = bytes(field.parts[field.data[0]]).decode()
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        msgs = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
        rendered = env.from_string(template).render(messages=msgs, add_generation_prompt=True,
                                                    bos_token="<|im_start|>",
                                                    eos_token="<|im_end|>")
        with ArborServer([], model=SMOLLM2, grpc=False) as srv:
            c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0,
                              timeout=300)
            model = c.models.list().data[0].id
            chat = c.chat.completions.create(model=model, messages=msgs, max_tokens=12,
                                             temperature=0)
            _, tok = raw(srv.port, "POST", "/tokenize",
                         json.dumps({"prompt": rendered, "add_special_tokens": False}))
            comp = c.completions.create(model=model, prompt=tok["tokens"], max_tokens=12,
                                        temperature=0)
        self.assertEqual(chat.usage.prompt_tokens, tok["count"])
        self.assertEqual(chat.choices[0].message.content, comp.choices[0].text)
        self.assertIn("Paris", chat.choices[0].message.content)


if __name__ == "__main__":
    unittest.main(verbosity=2)
