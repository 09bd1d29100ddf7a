"""Hostile and malformed input against a real `arbor serve` (issue: one request must never take
the server down). Raw HTTP, the official `openai` client and grpcio drive a server process on
loopback; after every test the server must still answer /health and a real completion.

References from outside the server: transformers' greedy tokens for stories260K
(tests/data/golden), llama2.c's tokenizer file for decoding them, the HTTP and gRPC front ends
checked against each other, `ss` for the listening socket's backlog.

Run: ARBOR_BIN=build/server/arbor ARBOR_SHARED_DIR=../shared python3 tests/server/test_hostile.py
"""
import json
import os
import re
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import openai

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ArborServer, ARBOR_BIN, STORIES, raw, tok512_pieces  # noqa: E402
import test_grpc  # noqa: E402  (proto stubs generated at test time)
from test_openai import tok512_decode  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(REPO, "tests", "data", "golden", "stories260K.json")
CHATML = os.path.join(REPO, "tests", "data", "chat_templates", "smollm2.jinja")
MODEL = "stories260K.bin"
MAX_PROMPT = 200  # the server's --max-prompt-tokens (ChatML "Hi" is ~110 tok512 tokens)


def setUpModule():
    test_grpc.setUpModule()


def tearDownModule():
    test_grpc.tearDownModule()


def nested(depth):
    return "[" * depth + "]" * depth


class Hostile(unittest.TestCase):
    """stories260K with a ChatML template, gRPC on, a prompt limit below the context."""

    @classmethod
    def setUpClass(cls):
        cls.srv = ArborServer(["--kv-blocks", "256", "--chat-template", CHATML,
                               "--max-prompt-tokens", str(MAX_PROMPT)]).start()
        cls.channel = test_grpc.channel(cls.srv)
        cls.stub = test_grpc.pb_grpc.ArborStub(cls.channel)
        cls.client = openai.OpenAI(base_url=cls.srv.base_url + "/v1", api_key="unused",
                                   max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.srv.stop()
        assert code == 0, f"server exited with {code}:\n{cls.srv.output()[-3000:]}"

    def tearDown(self):
        self.assert_serving()

    def assert_serving(self):
        self.assertEqual(raw(self.srv.port, "GET", "/health")[0], 200, self.srv.output()[-2000:])
        code, resp = raw(self.srv.port, "POST", "/v1/completions",
                         {"prompt": "Once", "max_tokens": 3, "temperature": 0})
        self.assertEqual(code, 200, resp)
        self.assertEqual(resp["usage"]["completion_tokens"], 3)

    def post(self, path, body, headers=None):
        return raw(self.srv.port, "POST", path, body, headers)

    # -- 1. depth limits ---------------------------------------------------------------------
    def test_deeply_nested_body_is_refused_before_any_recursion(self):
        # The crash as reported: ~600 KB, a message field nested 300,000 arrays deep.
        body = ('{"model": "%s", "messages": [{"role": "user", "content": "hi", "name": %s}]}'
                % (MODEL, nested(300000)))
        self.assertGreater(len(body), 590000)
        for path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
            code, resp = self.post(path, body)
            self.assertEqual(code, 400, (path, resp))
            self.assertEqual(resp["error"]["code"], "json_too_deep")
            self.assertIn("64 levels", resp["error"]["message"])
        # Unclosed nesting (not even JSON) gets the same verdict, in linear time.
        code, resp = self.post("/v1/chat/completions", "[" * 500000)
        self.assertEqual(code, 400)
        self.assertEqual(resp["error"]["code"], "json_too_deep")
        # Brackets inside strings do not count; 64 levels are fine, 65 are not.
        code, resp = self.post("/v1/completions", {"prompt": "[[[[" * 30, "max_tokens": 1})
        self.assertEqual(code, 200, resp)
        for depth, status in ((62, 200), (64, 400)):  # the body object adds one level
            code, resp = self.post("/v1/completions", '{"prompt": "x", "max_tokens": 1, '
                                   '"metadata": {"a": %s}}' % nested(depth))
            self.assertEqual(code, status, (depth, resp))

    def test_deep_message_fields_are_refused_by_name(self):
        code, resp = self.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi", "name": [[["x"]]]}]})
        self.assertEqual(code, 400)
        self.assertEqual(resp["error"]["param"], "messages[0].name")
        code, resp = self.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi", "extra": {"a": [1]}}]})
        self.assertEqual(code, 400)
        self.assertEqual(resp["error"]["param"], "messages[0].extra")

    # -- 2. one place for limits: HTTP and gRPC give the same verdict --------------------------
    CASES = [  # (fields, ok?)
        ({"max_tokens": 4}, True),
        ({"max_tokens": 0}, False),
        ({"max_tokens": -3}, False),
        ({"max_tokens": 100000}, False),
        ({"n": 0}, False),
        ({"n": 129}, False),
        ({"n": 2, "temperature": 0.5, "seed": 7}, True),
        ({"logprobs": 21}, False),
        ({"logprobs": 2}, True),
        ({"temperature": 2.5}, False),
        ({"top_p": 0.0}, False),
        ({"top_p": 1.5}, False),
        ({"top_k": -2}, False),
        ({"min_p": 1.5}, False),
        ({"presence_penalty": 3.0}, False),
        ({"frequency_penalty": -3.0}, False),
        ({"repetition_penalty": 0.0}, False),
        ({"stop": ["a"] * 16}, True),
        ({"stop": ["a"] * 17}, False),
        ({"stop": [""]}, False),
        ({"stop": ["x" * 257]}, False),
        ({"logit_bias": {"99999": 1.0}}, False),
        ({"logit_bias": {"5": 150.0}}, False),
        ({"logit_bias": {"5": -100.0, "9": 2.5}}, True),
        ({"prompt": [1, 99999]}, False),
        ({"prompt": [1] + [300] * MAX_PROMPT}, False),  # over --max-prompt-tokens
        ({"prompt": [1] + [300] * (MAX_PROMPT - 1)}, True),
    ]

    def grpc_request(self, fields):
        req = test_grpc.pb.GenerateRequest(model=MODEL)
        req.token_ids.ids.extend(fields.get("prompt", [1, 403, 407]))
        for key, value in fields.items():
            if key == "prompt":
                continue
            if key == "stop":
                req.stop.extend(value)
            elif key == "logit_bias":
                for token, bias in value.items():
                    req.logit_bias[int(token)] = bias
            else:
                setattr(req, key, value)
        if "temperature" not in fields:
            req.temperature = 0.0
        return req

    def test_http_and_grpc_give_the_same_verdict(self):
        for fields, ok in self.CASES:
            body = {"prompt": [1, 403, 407], "max_tokens": 8, "temperature": 0, **fields}
            code, resp = self.post("/v1/completions", body)
            req = self.grpc_request({"max_tokens": 8, **fields})
            try:
                g = self.stub.Generate(req, timeout=60)
                g_code, g_msg = grpc.StatusCode.OK, ""
            except grpc.RpcError as e:
                g_code, g_msg = e.code(), e.details()
            if ok:
                self.assertEqual(code, 200, (fields, resp))
                self.assertEqual(g_code, grpc.StatusCode.OK, (fields, g_msg))
                self.assertEqual([c["text"] for c in resp["choices"]],
                                 [c.text for c in g.choices], fields)
            else:
                self.assertEqual(code, 400, (fields, resp))
                self.assertEqual(g_code, grpc.StatusCode.INVALID_ARGUMENT, (fields, g_msg))
                self.assertEqual(resp["error"]["message"], g_msg, fields)
                expected = "prompt" if "prompt" in fields else next(iter(fields))
                self.assertEqual(resp["error"]["param"], expected, fields)

    def test_fan_out_is_bounded(self):
        code, resp = self.post("/v1/completions", {"prompt": ["a"] * 65, "max_tokens": 1})
        self.assertEqual((code, resp["error"]["param"]), (400, "prompt"), resp)
        code, resp = self.post("/v1/completions", {"prompt": ["a"] * 4, "n": 65, "max_tokens": 1})
        self.assertEqual((code, resp["error"]["param"]), (400, "n"), resp)
        self.assertIn("256", resp["error"]["message"])

    # -- 3. integers as integers ---------------------------------------------------------------
    def test_integers_are_parsed_as_integers(self):
        cases = [
            ({"max_tokens": 2**32 + 16}, "max_tokens"),
            ({"max_tokens": 16.0}, "max_tokens"),
            ({"max_tokens": 1e1}, "max_tokens"),
            ({"n": 1.5}, "n"),
            ({"logprobs": 2.0}, "logprobs"),
            ({"top_k": 4.0}, "top_k"),
            ({"seed": 2**64}, "seed"),
            ({"seed": 1.5}, "seed"),
            ({"prompt": [1, 2.0]}, "prompt"),
            ({"prompt": [1, 2**40]}, "prompt"),
            ({"logit_bias": {"1.5": 1}}, "logit_bias"),
            ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ]
        for fields, param in cases:
            body = {"prompt": "Once", "max_tokens": 2, **fields}
            code, resp = self.post("/v1/completions", body)
            self.assertEqual(code, 400, (fields, resp))
            self.assertEqual(resp["error"]["param"], param, fields)

    def test_seeds_keep_their_exact_value(self):
        def http_sample(seed):
            code, resp = self.post("/v1/completions", {
                "prompt": [1], "max_tokens": 48, "temperature": 1.5, "seed": seed,
                "ignore_eos": True})
            self.assertEqual(code, 200, resp)
            return resp["choices"][0]["text"]

        def grpc_sample(seed):
            r = self.stub.Generate(test_grpc.pb.GenerateRequest(
                model=MODEL, token_ids=test_grpc.pb.TokenIds(ids=[1]), max_tokens=48,
                temperature=1.5, seed=seed, ignore_eos=True), timeout=60)
            return r.choices[0].text

        big = 2**53 + 1  # a double would round it to 2**53
        self.assertEqual(http_sample(big), grpc_sample(big))
        self.assertNotEqual(http_sample(big), http_sample(2**53))
        self.assertEqual(http_sample(2**64 - 1), grpc_sample(2**64 - 1))
        self.assertEqual(http_sample(-1), grpc_sample(2**64 - 1))  # two's complement

    # -- 4. status codes ---------------------------------------------------------------------
    def test_tokenize_wrong_types_are_400(self):
        for body, param in (({"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
                            ({"prompt": 5}, "prompt"),
                            ({"prompt": "x", "bogus": 1}, "bogus")):
            code, resp = self.post("/tokenize", body)
            self.assertEqual(code, 400, (body, resp))
            self.assertEqual(resp["error"]["param"], param)
        code, resp = self.post("/tokenize", {"prompt": "Once upon", "add_special_tokens": False})
        self.assertEqual(code, 200, resp)
        self.assertNotIn(1, resp["tokens"])

    def test_adversarial_stop_strings_do_not_stall_the_engine(self):
        # logit_bias forces one token; 16 stops of 255 copies of its text plus a byte that never
        # comes keep 255 bytes held back in each of 32 choices, scanned at every step. The scan
        # is linear (server/stop_strings.h; tests/unit/stop_strings_test.cc checks it against
        # the definition); here the request must cost about what it costs without stops.
        pieces = tok512_pieces()
        token = next(i for i, p in enumerate(pieces) if p == b"a")
        body = {"prompt": [1], "max_tokens": 96, "temperature": 0, "n": 32,
                "logit_bias": {str(token): 100}, "ignore_eos": True}

        def timed(extra):
            t0 = time.monotonic()
            code, resp = self.post("/v1/completions", {**body, **extra})
            self.assertEqual(code, 200, resp)
            return time.monotonic() - t0, resp

        # The fastest of three runs each way, alternated: a scan that is not linear is slow in
        # every run, while a burst of load from the tests running beside this one (2 cores in
        # CI) slows one run by a second or more.
        stops = [("a" * 255 + chr(ord("b") + k)) for k in range(16)]
        plain = with_stops = float("inf")
        for _ in range(3):
            plain = min(plain, timed({})[0])
            t, resp = timed({"stop": stops})
            with_stops = min(with_stops, t)
            self.assertEqual({c["finish_reason"] for c in resp["choices"]}, {"length"})
            self.assertEqual(resp["choices"][0]["text"], "a" * 96)
        self.assertLess(with_stops, 3 * plain + 1.0, (with_stops, plain))

    # -- 8. no field silently ignored --------------------------------------------------------
    def test_unimplemented_fields_are_refused_by_name(self):
        msgs = [{"role": "user", "content": "Hi"}]
        cases = [
            ("/v1/chat/completions", {"response_format": {"type": "json_object"}},
             "response_format"),
            ("/v1/chat/completions", {"response_format": {"type": "json_schema"}},
             "response_format"),
            ("/v1/chat/completions", {"tools": [{"type": "function",
                                                 "function": {"name": "f"}}]}, "tools"),
            ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
            ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
            ("/v1/chat/completions", {"audio": {"voice": "x"}}, "audio"),
            ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
            ("/v1/chat/completions", {"frobnicate": 1}, "frobnicate"),
            ("/v1/completions", {"suffix": "end"}, "suffix"),
            ("/v1/completions", {"messages": msgs}, "messages"),
        ]
        for path, extra, param in cases:
            body = {"max_tokens": 2, **extra}
            body.setdefault("messages" if "chat" in path else "prompt",
                            msgs if "chat" in path else "Once")
            code, resp = self.post(path, body)
            self.assertEqual(code, 400, (path, extra, resp))
            self.assertEqual(resp["error"]["param"], param, resp)
        # Fields that change nothing are accepted; text response_format is what we do.
        r = self.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=2, user="u1", metadata={"k": "v"},
            response_format={"type": "text"}, store=False)
        self.assertEqual(r.usage.completion_tokens, 2)
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2,
                                                response_format={"type": "json_object"})
        self.assertIn("response_format", str(e.exception))

    def test_logit_bias_with_the_openai_client(self):
        with open(GOLDEN) as f:
            golden = json.load(f)["greedy_tokens"]
        plain = self.client.completions.create(model=MODEL, prompt=[1], max_tokens=12,
                                               temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(plain.choices[0].text, tok512_decode(golden[:12]))
        # -100 on greedy's first token: the first token changes, to the runner-up.
        banned = self.client.completions.create(
            model=MODEL, prompt=[1], max_tokens=1, temperature=0, logprobs=2,
            logit_bias={str(golden[0]): -100}, extra_body={"ignore_eos": True})
        self.assertNotEqual(banned.choices[0].text, tok512_decode(golden[:1]))
        # +100 on one token: greedy emits it at every step.
        forced = self.client.completions.create(
            model=MODEL, prompt=[1], max_tokens=5, temperature=0, logit_bias={"300": 100},
            extra_body={"ignore_eos": True})
        self.assertEqual(forced.choices[0].text, tok512_decode([300] * 5))
        # Sampled at temperature 1 with +100: still that token (the bias dwarfs the logits).
        sampled = self.client.completions.create(
            model=MODEL, prompt=[1], max_tokens=5, temperature=1, seed=3,
            logit_bias={"300": 100}, extra_body={"ignore_eos": True})
        self.assertEqual(sampled.choices[0].text, tok512_decode([300] * 5))


class Auth(unittest.TestCase):
    def test_which_routes_the_api_key_protects(self):
        key = "s3cret-key"
        with ArborServer(["--api-key", key], grpc=False) as srv:
            protected = [("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}),
                         ("POST", "/v1/chat/completions", {"messages": [
                             {"role": "user", "content": "x"}], "max_tokens": 1}),
                         ("GET", "/v1/models", None),
                         ("POST", "/tokenize", {"prompt": "x"})]
            wrong = [None, "Bearer wrong", "Bearer " + key[:-1], "Bearer " + key + "x",
                     "Bearer " + "z" * len(key), key]
            for method, path, body in protected:
                for auth in wrong:
                    headers = {"Authorization": auth} if auth else {}
                    code, resp = raw(srv.port, method, path, body, headers)
                    self.assertEqual(code, 401, (path, auth, resp))
                    self.assertEqual(resp["error"]["code"], "invalid_api_key")
                code, resp = raw(srv.port, method, path, body,
                                 {"Authorization": "Bearer " + key})
                self.assertIn(code, (200, 400), (path, resp))  # the chat template may be absent
                self.assertNotEqual(code, 401)
            for path in ("/health", "/metrics"):  # public: probes and scrapers
                self.assertEqual(raw(srv.port, "GET", path)[0], 200, path)


class EngineFailure(unittest.TestCase):
    """A model whose weights make the logits NaN: every request fails in the engine, after it
    was accepted. The server must answer 500 with an error body (not 200) and keep serving."""

    def test_failed_generation_is_a_5xx_with_an_error_body(self):
        tmp = tempfile.mkdtemp(prefix="arbor_nan_model_")
        try:
            path = os.path.join(tmp, "nan.bin")
            with open(STORIES, "rb") as f:
                data = bytearray(f.read())
            dim = struct.unpack("<i", data[:4])[0]
            # The token embedding table follows the 7-int header: NaN in every row poisons the
            # hidden state, and so the logits, of any prompt.
            vocab = abs(struct.unpack("<i", data[20:24])[0])
            nan = struct.pack("<f", float("nan"))
            data[28:28 + vocab * dim * 4] = nan * (vocab * dim)
            with open(path, "wb") as f:
                f.write(data)
            shutil.copy(os.path.join(os.path.dirname(STORIES), "tok512.bin"), tmp)
            with ArborServer([], model=path, grpc=False) as srv:
                for _ in range(3):
                    code, resp = raw(srv.port, "POST", "/v1/completions",
                                     {"prompt": "Once", "max_tokens": 8, "temperature": 0})
                    self.assertEqual(code, 500, resp)
                    self.assertEqual(resp["error"]["type"], "internal_error")
                    self.assertIn("engine", resp["error"]["message"])
                # Streamed: the status went out with the first byte; the error is an event.
                code, text = raw(srv.port, "POST", "/v1/completions",
                                 {"prompt": "Once", "max_tokens": 8, "stream": True})
                self.assertEqual(code, 200)
                self.assertIn('"internal_error"', text)
                self.assertTrue(text.rstrip().endswith("data: [DONE]"), text[-200:])
                self.assertEqual(raw(srv.port, "GET", "/health")[0], 200)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def connection_burst(port, n):
    """Opens n connections at once (non-blocking connects in one loop, no client-side
    scheduling in the way), sends GET /health on each as soon as it is writable, reads the
    answer, closes. -> (status codes, per-connection seconds from connect to answer, total)."""
    sel = selectors.DefaultSelector()
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    conns = {}
    t_start = time.monotonic()
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        conns[s] = {"t0": time.monotonic(), "data": b"", "sent": False, "elapsed": None}
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE)
    left = n
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            s, c = key.fileobj, conns[key.fileobj]
            if not c["sent"]:
                s.send(request)
                c["sent"] = True
                sel.modify(s, selectors.EVENT_READ)
                continue
            chunk = s.recv(65536)
            c["data"] += chunk
            head, sep, body = c["data"].partition(b"\r\n\r\n")
            length = re.search(rb"Content-Length: (\d+)", head, re.I)
            if not chunk or (sep and length and len(body) >= int(length.group(1))):
                c["elapsed"] = time.monotonic() - c["t0"]
                sel.unregister(s)
                s.close()
                left -= 1
    for s in list(sel.get_map().values()):
        s.fileobj.close()
    statuses = [c["data"].split(b" ")[1] if c["data"] else b"" for c in conns.values()]
    elapsed = sorted(c["elapsed"] if c["elapsed"] is not None else 99.0 for c in conns.values())
    return statuses, elapsed, time.monotonic() - t_start


class ConnectionBurst(unittest.TestCase):
    CONNECTIONS = 512

    def test_listen_backlog_and_a_burst_of_new_connections(self):
        with ArborServer([], grpc=False) as srv:
            out = subprocess.run(["ss", "-ltnH", f"sport = :{srv.port}"], capture_output=True,
                                 text=True, check=True).stdout
            fields = out.split()
            self.assertGreaterEqual(len(fields), 4, out)
            self.assertGreaterEqual(int(fields[2]), 512, out)  # Send-Q: the backlog
            connection_burst(srv.port, 64)  # warm-up: the handler threads exist
            worst = []
            for _ in range(3):
                statuses, elapsed, total = connection_burst(srv.port, self.CONNECTIONS)
                self.assertEqual(statuses, [b"200"] * self.CONNECTIONS)
                # A dropped SYN costs its client the kernel's 1 s retransmit.
                self.assertLess(total, 1.0)
                worst.append(elapsed[-1])
                print(f"\n{self.CONNECTIONS} connections: slowest {elapsed[-1] * 1000:.1f} ms, "
                      f"median {elapsed[len(elapsed) // 2] * 1000:.1f} ms, all in "
                      f"{total * 1000:.0f} ms", file=sys.stderr)
            # Every connection of a burst answered within 200 ms (the best of three bursts, as
            # the test machine is shared with other tests). An ASan build is about twice as
            # slow per connection: there only the 1 s bound (no dropped SYN) applies.
            if os.environ.get("ARBOR_SANITIZED", "0") != "1":
                self.assertLess(min(worst), 0.2, worst)


class GenerateStreams(unittest.TestCase):
    def test_generate_writes_only_the_text_to_stdout(self):
        with open(GOLDEN) as f:
            golden = json.load(f)["greedy_tokens"]
        r = subprocess.run([ARBOR_BIN, "generate", "-m", STORIES, "-p", "", "-n", "20",
                            "--temperature", "0", "--ignore-eos"], capture_output=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.decode(), tok512_decode(golden[:20]))
        self.assertIn(b"loaded", r.stderr)
        r = subprocess.run([ARBOR_BIN, "generate", "-m", STORIES, "-p", "Once upon a time",
                            "-n", "4", "--temperature", "0", "--echo"], capture_output=True,
                           timeout=120)
        self.assertTrue(r.stdout.decode().startswith("Once upon a time"), r.stdout)
        r = subprocess.run([ARBOR_BIN, "generate", "-m", STORIES, "-p", "x",
                            "--temperature", "hot"], capture_output=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"temperature", r.stderr)
        self.assertEqual(r.stdout, b"")


if __name__ == "__main__":
    unittest.main(verbosity=2)
