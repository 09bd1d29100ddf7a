"""`arbor serve`'s gRPC API as clients use it: a real server process on loopback, driven by a
grpcio client whose stubs are generated from proto/ at test time (grpc_tools.protoc). The
references come from outside the gRPC front end: the HTTP /v1/completions answers for the same
requests, llama2.c's tokenizer file (tok512.bin) for token pieces, and the standard
grpc.health.v1 protocol (proto/grpc/health/v1/health.proto).

Needs grpcio and grpcio-tools (scripts/setup_python.sh); without them the test fails.
Run: ARBOR_BIN=build/server/arbor ARBOR_SHARED_DIR=../shared python3 tests/server/test_grpc.py
"""
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ArborServer, SHARED, tok512_pieces  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
PROTO_DIR = os.path.join(REPO, "proto")
MODEL = "stories260K.bin"

pb = pb_grpc = health_pb = health_grpc = None
_stub_dir = None


def setUpModule():
    """Generates the Python stubs of proto/arbor.proto and the health protocol into a temp dir."""
    global pb, pb_grpc, health_pb, health_grpc, _stub_dir
    _stub_dir = tempfile.mkdtemp(prefix="arbor_grpc_stubs_")
    # health.proto is copied flat: generated under grpc/health/v1/ it would shadow the `grpc`
    # package itself.
    shutil.copy(os.path.join(PROTO_DIR, "grpc", "health", "v1", "health.proto"), _stub_dir)
    for include, proto in ((PROTO_DIR, os.path.join(PROTO_DIR, "arbor.proto")),
                           (_stub_dir, os.path.join(_stub_dir, "health.proto"))):
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", include,
                        "--python_out", _stub_dir, "--grpc_python_out", _stub_dir, proto],
                       check=True)
    sys.path.insert(0, _stub_dir)
    pb = importlib.import_module("arbor_pb2")
    pb_grpc = importlib.import_module("arbor_pb2_grpc")
    health_pb = importlib.import_module("health_pb2")
    health_grpc = importlib.import_module("health_pb2_grpc")


def tearDownModule():
    if _stub_dir:
        shutil.rmtree(_stub_dir, ignore_errors=True)


def http_completion(srv, body, headers=None):
    req = urllib.request.Request(srv.base_url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def channel(srv):
    ch = grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}")
    try:
        grpc.channel_ready_future(ch).result(timeout=30)
    except grpc.FutureTimeoutError:
        ch.close()
        raise AssertionError(f"no gRPC server on port {srv.grpc_port}:\n{srv.output()[-2000:]}")
    return ch


def stream_all(stub, req, **kw):
    """Concatenates a GenerateStream: {index: (text, token_ids, finish_reason)}, usage, count."""
    texts, tokens, finish = {}, {}, {}
    usage = None
    messages = 0
    for msg in stub.GenerateStream(req, **kw):
        messages += 1
        indices = [c.index for c in msg.choices]
        assert len(set(indices)) == len(indices), f"a choice twice in one message: {indices}"
        for c in msg.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens.setdefault(c.index, []).extend(c.token_ids)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
        if msg.HasField("usage"):
            usage = msg.usage
    out = {i: (texts[i], tokens.get(i, []), finish.get(i, "")) for i in texts}
    return out, usage, messages


def wait_for_free_blocks(test, srv, timeout=20):
    deadline = time.time() + timeout
    while True:
        m = srv.metrics()
        if m["arbor_kv_blocks_used"] == 0 and m["arbor_running_sequences"] == 0:
            return m
        if time.time() > deadline:
            test.fail(f"KV blocks still in use: {m['arbor_kv_blocks_used']}, running "
                      f"{m['arbor_running_sequences']}")
        time.sleep(0.1)


PROMPTS = ["Once upon a time", "Lily and Ben", "The little dog was sad because", "One day"]


class StoriesGrpc(unittest.TestCase):
    """stories260K, plain decoding: generation, tokenize, model info, health, cancel, errors."""

    @classmethod
    def setUpClass(cls):
        cls.srv = ArborServer(["--kv-blocks", "512", "--max-running", "64"]).start()
        try:
            cls.channel = channel(cls.srv)
        except Exception:
            cls.srv.stop()  # tearDownClass does not run when setUpClass fails
            raise
        cls.stub = pb_grpc.ArborStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.srv.stop()

    def greedy(self, prompt, max_tokens=48, **kw):
        return pb.GenerateRequest(text=prompt, max_tokens=max_tokens, temperature=0, **kw)

    def test_unary_equals_stream_equals_http(self):
        for p in PROMPTS:
            unary = self.stub.Generate(self.greedy(p), timeout=60)
            self.assertEqual(unary.model, MODEL)
            self.assertEqual(len(unary.choices), 1)
            u = unary.choices[0]
            streamed, usage, messages = stream_all(self.stub, self.greedy(p), timeout=60)
            http = http_completion(self.srv, {"prompt": p, "max_tokens": 48, "temperature": 0})
            self.assertGreater(len(u.text), 0)
            self.assertEqual(u.text, http["choices"][0]["text"], p)
            self.assertEqual(streamed[0][0], u.text, p)
            self.assertEqual(streamed[0][1], list(u.token_ids), p)
            self.assertEqual(u.finish_reason, http["choices"][0]["finish_reason"])
            self.assertEqual(streamed[0][2], u.finish_reason)
            self.assertEqual(unary.usage.prompt_tokens, http["usage"]["prompt_tokens"])
            self.assertEqual(unary.usage.completion_tokens, http["usage"]["completion_tokens"])
            self.assertEqual(unary.usage.completion_tokens, len(u.token_ids))
            self.assertEqual(usage.completion_tokens, unary.usage.completion_tokens)
            self.assertEqual(unary.usage.accepted_draft_tokens, 0)
            self.assertGreater(unary.usage.decode_steps, 0)
            self.assertAlmostEqual(unary.usage.mean_accepted_length, 1.0, places=6)

    def test_tokenize_matches_tok512_and_token_prompts(self):
        info = self.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10)
        t = self.stub.Tokenize(pb.TokenizeRequest(text="Once upon a time"), timeout=10)
        ids = list(t.token_ids)
        self.assertTrue(info.add_bos)
        self.assertEqual(ids[0], info.bos_id)
        vocab = tok512_pieces()
        self.assertEqual(b"".join(vocab[i] for i in ids[1:]), b" Once upon a time")
        self.assertEqual(list(t.pieces[1:]), [vocab[i] for i in ids[1:]])
        no_bos = self.stub.Tokenize(pb.TokenizeRequest(text="Once upon a time", add_bos=False))
        self.assertEqual(list(no_bos.token_ids), ids[1:])
        # The same prompt as token ids generates the same text, over gRPC and over HTTP.
        by_text = self.stub.Generate(self.greedy("Once upon a time"), timeout=60)
        by_ids = self.stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids),
                                                       max_tokens=48, temperature=0), timeout=60)
        http = http_completion(self.srv, {"prompt": ids, "max_tokens": 48, "temperature": 0})
        self.assertEqual(by_ids.choices[0].text, by_text.choices[0].text)
        self.assertEqual(by_ids.choices[0].text, http["choices"][0]["text"])
        self.assertEqual(by_ids.usage.prompt_tokens, len(ids))

    def test_model_info_matches_http_models(self):
        info = self.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10)
        with urllib.request.urlopen(self.srv.base_url + "/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]
        self.assertEqual(info.id, MODEL)
        self.assertEqual(info.id, model["id"])
        self.assertEqual(info.max_context, model["max_model_len"])
        self.assertGreater(info.max_context, 0)
        self.assertEqual(info.vocab_size, 512)
        self.assertEqual(info.speculation, "off")
        self.assertEqual(info.backend, "cpu")
        self.assertEqual(info.bos_id, 1)
        self.assertEqual(info.eos_id, 2)

    def test_health_service(self):
        health = health_grpc.HealthStub(self.channel)
        serving = health_pb.HealthCheckResponse.SERVING
        for service in ("", "arbor.v1.Arbor"):
            r = health.Check(health_pb.HealthCheckRequest(service=service), timeout=10)
            self.assertEqual(r.status, serving, service)
        with self.assertRaises(grpc.RpcError) as cm:
            health.Check(health_pb.HealthCheckRequest(service="no.such.Service"), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_stop_strings_logprobs_and_n_match_http(self):
        p = "Once upon a time"
        g = self.stub.Generate(self.greedy(p, 40, stop=["."], logprobs=2), timeout=60)
        h = http_completion(self.srv, {"prompt": p, "max_tokens": 40, "temperature": 0,
                                       "stop": ["."], "logprobs": 2})
        c = g.choices[0]
        self.assertEqual(c.text, h["choices"][0]["text"])
        self.assertNotIn(".", c.text)
        self.assertEqual(c.finish_reason, "stop")
        self.assertEqual(len(c.logprobs), len(c.token_ids))
        for lp in c.logprobs:
            self.assertEqual(len(lp.top), 2)
            self.assertEqual(lp.top[0].token, lp.token)  # greedy: the chosen is the most likely
            self.assertAlmostEqual(lp.top[0].logprob, lp.logprob, places=5)
        http_lps = h["choices"][0]["logprobs"]["token_logprobs"]
        for lp, ref in zip(c.logprobs, http_lps):
            self.assertAlmostEqual(lp.logprob, ref, places=4)
        # n > 1 with a seed: every choice present, reproducible.
        req = pb.GenerateRequest(text=p, max_tokens=20, temperature=0.9, seed=7, n=3)
        a = self.stub.Generate(req, timeout=60)
        b, _, _ = stream_all(self.stub, req, timeout=60)
        self.assertEqual([x.index for x in a.choices], [0, 1, 2])
        self.assertEqual(sorted(b), [0, 1, 2])
        for x in a.choices:
            self.assertEqual(b[x.index][0], x.text)
            self.assertIn(x.finish_reason, ("stop", "length"))
        self.assertEqual(a.usage.completion_tokens, sum(len(x.token_ids) for x in a.choices))

    def test_64_concurrent_streams_equal_alone(self):
        prompts = [f"{PROMPTS[i % len(PROMPTS)]}{' ' * (i // len(PROMPTS) % 2)}" for i in range(64)]
        alone = {p: self.stub.Generate(self.greedy(p, 32), timeout=60).choices[0].text
                 for p in set(prompts)}
        results = [None] * len(prompts)

        def run(i):
            try:
                out, _, _ = stream_all(self.stub, self.greedy(prompts[i], 32), timeout=120)
                results[i] = out[0][0]
            except grpc.RpcError as e:
                results[i] = e

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p, r in zip(prompts, results):
            self.assertEqual(r, alone[p], repr(p))

    def test_client_cancel_frees_blocks(self):
        before = self.srv.metrics().get('arbor_requests_total{status="cancelled"}', 0)
        req = pb.GenerateRequest(text="Once upon a time", max_tokens=480, ignore_eos=True,
                                 temperature=0.8)
        calls = [self.stub.GenerateStream(req) for _ in range(16)]
        for call in calls:
            for i, _ in enumerate(call):
                if i == 1:  # two messages read
                    break
        self.assertGreater(self.srv.metrics()["arbor_kv_blocks_used"], 0)
        for call in calls:
            call.cancel()
        m = wait_for_free_blocks(self, self.srv)
        self.assertGreaterEqual(m['arbor_requests_total{status="cancelled"}'] - before, 16)
        for call in calls:
            self.assertEqual(call.code(), grpc.StatusCode.CANCELLED)
        # A deadline cancels a unary call the same way.
        # (8 choices of 480 tokens take ~0.5 s alone on stories260K.)
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.Generate(pb.GenerateRequest(text="Once", max_tokens=480, n=8,
                                                  ignore_eos=True), timeout=0.05)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        wait_for_free_blocks(self, self.srv)
        r = self.stub.Generate(self.greedy("Once", 3), timeout=60)
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_invalid_requests_answer_with_codes(self):
        info = self.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=10)
        long_ids = pb.TokenIds(ids=[1] + [100] * (info.max_context - 1))
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        cases = [
            (pb.GenerateRequest(text="x", max_tokens=0), invalid, "max_tokens"),
            (pb.GenerateRequest(text="x", max_tokens=-1), invalid, "max_tokens"),
            (pb.GenerateRequest(text="", max_tokens=4), invalid, "text"),
            (pb.GenerateRequest(max_tokens=4), invalid, "prompt"),
            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[]), max_tokens=4), invalid, "prompt"),
            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 512]), max_tokens=4), invalid,
             "512"),
            (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, -3]), max_tokens=4), invalid, "-3"),
            (pb.GenerateRequest(token_ids=long_ids, max_tokens=1), invalid, "context"),
            (pb.GenerateRequest(text="x", max_tokens=info.max_context), invalid, "max_tokens"),
            (pb.GenerateRequest(text="x", max_tokens=2**31 - 1), invalid, "max_tokens"),
            (pb.GenerateRequest(text="x", temperature=3), invalid, "temperature"),
            (pb.GenerateRequest(text="x", temperature=float("nan")), invalid, "temperature"),
            (pb.GenerateRequest(text="x", top_p=0), invalid, "top_p"),
            (pb.GenerateRequest(text="x", min_p=1.5), invalid, "min_p"),
            (pb.GenerateRequest(text="x", top_k=-2), invalid, "top_k"),
            (pb.GenerateRequest(text="x", presence_penalty=5), invalid, "presence_penalty"),
            (pb.GenerateRequest(text="x", repetition_penalty=0), invalid, "repetition_penalty"),
            (pb.GenerateRequest(text="x", n=0), invalid, "'n' must"),
            (pb.GenerateRequest(text="x", n=1000), invalid, "'n' must"),
            (pb.GenerateRequest(text="x", logprobs=21), invalid, "logprobs"),
            (pb.GenerateRequest(text="x", stop=[""]), invalid, "'stop' strings"),
            (pb.GenerateRequest(text="x", stop=["a"] * 17), invalid, "'stop' holds at most 16"),
            (pb.GenerateRequest(text="x", speculate=True), invalid, "speculat"),
            (pb.GenerateRequest(text="x", model="gpt-4"), grpc.StatusCode.NOT_FOUND, "gpt-4"),
        ]
        for req, code, needle in cases:
            for rpc in (self.stub.Generate,
                        lambda r, **kw: list(self.stub.GenerateStream(r, **kw))):
                with self.assertRaises(grpc.RpcError, msg=str(req)) as cm:
                    rpc(req, timeout=30)
                self.assertEqual(cm.exception.code(), code, f"{req}: {cm.exception.details()}")
                self.assertIn(needle, cm.exception.details(), str(req))
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.Tokenize(pb.TokenizeRequest(text="x", model="nope"), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        # Bytes that are no GenerateRequest (garbage; a text field that is not UTF-8) never
        # reach the engine.
        raw_generate = self.channel.unary_unary("/arbor.v1.Arbor/Generate")
        for body in (b"\xff\xff\xff\xff", b"\x12\x02\xff\xfe\x20\x04"):
            with self.assertRaises(grpc.RpcError) as cm:
                raw_generate(body, timeout=10)
            self.assertIn(cm.exception.code(),
                          (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), body)
        # Still serving, nothing leaked.
        self.assertEqual(self.stub.Generate(self.greedy("Once", 2)).usage.completion_tokens, 2)
        wait_for_free_blocks(self, self.srv)


class SpeculatingGrpc(unittest.TestCase):
    def test_eagle_greedy_equals_plain_and_reports_acceptance(self):
        heads = os.path.join(REPO, "tests", "data", "heads", "stories260K", "eagle")
        with ArborServer(["--spec", "eagle", "--spec-heads", heads,
                          "--spec-adaptive", "false"]) as srv:
            with channel(srv) as ch:
                stub = pb_grpc.ArborStub(ch)
                self.assertEqual(stub.GetModelInfo(pb.ModelInfoRequest()).speculation, "eagle")
                for p in PROMPTS[:3]:
                    req = dict(text=p, max_tokens=64, temperature=0)
                    spec = stub.Generate(pb.GenerateRequest(**req), timeout=60)
                    off = stub.Generate(pb.GenerateRequest(speculate=False, **req), timeout=60)
                    streamed, usage, _ = stream_all(stub, pb.GenerateRequest(**req), timeout=60)
                    self.assertEqual(spec.choices[0].text, off.choices[0].text, p)
                    self.assertEqual(streamed[0][0], spec.choices[0].text, p)
                    self.assertGreater(spec.usage.accepted_draft_tokens, 0)
                    self.assertGreater(spec.usage.mean_accepted_length, 1.5)
                    self.assertGreater(usage.accepted_draft_tokens, 0)
                    self.assertEqual(off.usage.accepted_draft_tokens, 0)


class OperationsGrpc(unittest.TestCase):
    def test_api_key_in_metadata(self):
        with ArborServer(["--api-key", "s3cret"]) as srv, channel(srv) as ch:
            stub = pb_grpc.ArborStub(ch)
            req = pb.GenerateRequest(text="x", max_tokens=2)
            for metadata in (None, (("authorization", "Bearer wrong"),),
                             (("authorization", "s3cret"),), (("x-api-key", "s3cret"),)):
                for call in (lambda: stub.Generate(req, metadata=metadata, timeout=10),
                             lambda: list(stub.GenerateStream(req, metadata=metadata,
                                                              timeout=10)),
                             lambda: stub.Tokenize(pb.TokenizeRequest(text="x"),
                                                   metadata=metadata, timeout=10),
                             lambda: stub.GetModelInfo(pb.ModelInfoRequest(),
                                                       metadata=metadata, timeout=10)):
                    with self.assertRaises(grpc.RpcError) as cm:
                        call()
                    self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            good = (("authorization", "Bearer s3cret"),)
            self.assertEqual(stub.Generate(req, metadata=good, timeout=30)
                             .usage.completion_tokens, 2)
            out, _, _ = stream_all(stub, req, metadata=good, timeout=30)
            self.assertEqual(len(out[0][1]), 2)
            # Health checks need no key (load balancers probe without one).
            r = health_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(), timeout=10)
            self.assertEqual(r.status, health_pb.HealthCheckResponse.SERVING)

    def test_full_queue_answers_resource_exhausted(self):
        with ArborServer(["--max-running", "1", "--max-queue", "1"]) as srv, channel(srv) as ch:
            stub = pb_grpc.ArborStub(ch)
            req = pb.GenerateRequest(text="Once", max_tokens=480, ignore_eos=True)
            codes = []
            lock = threading.Lock()

            def run():
                try:
                    out, _, _ = stream_all(stub, req, timeout=120)
                    code = grpc.StatusCode.OK if len(out[0][1]) == 480 else None
                except grpc.RpcError as e:
                    code = e.code()
                with lock:
                    codes.append(code)

            threads = [threading.Thread(target=run) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertIn(grpc.StatusCode.RESOURCE_EXHAUSTED, codes)
            self.assertIn(grpc.StatusCode.OK, codes)
            self.assertEqual(set(codes), {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED})
            self.assertEqual(stub.Generate(pb.GenerateRequest(text="x", max_tokens=2),
                                           timeout=30).usage.completion_tokens, 2)

    def test_sigterm_drains_streams_then_refuses(self):
        with ArborServer([]) as srv, channel(srv) as ch:
            self.drain_and_check(srv, ch)

    def drain_and_check(self, srv, ch):
        stub = pb_grpc.ArborStub(ch)
        health = health_grpc.HealthStub(ch)
        req = pb.GenerateRequest(text="Once", max_tokens=480, ignore_eos=True)
        it = stub.GenerateStream(req, timeout=120)
        tokens = list(next(it).choices[0].token_ids)
        srv.proc.send_signal(signal.SIGTERM)
        # While it drains (or once it is gone) new calls are refused and health is not SERVING.
        time.sleep(0.05)
        with self.assertRaises(grpc.RpcError) as cm:
            stub.Generate(pb.GenerateRequest(text="x", max_tokens=2), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        try:
            status = health.Check(health_pb.HealthCheckRequest(), timeout=10).status
            self.assertEqual(status, health_pb.HealthCheckResponse.NOT_SERVING)
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
        # The stream in flight runs to its end.
        finish = ""
        for msg in it:
            for c in msg.choices:
                tokens.extend(c.token_ids)
                finish = c.finish_reason or finish
        self.assertEqual((len(tokens), finish), (480, "length"))
        self.assertEqual(srv.proc.wait(60), 0, srv.output())


if __name__ == "__main__":
    unittest.main(verbosity=2)
