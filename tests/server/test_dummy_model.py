"""`arbor serve --model dummy:PRESET` (random weights of a named shape, no tokenizer) on the CPU
backend: token-id completions run to max_tokens with ignore_eos and stream text per token; text
prompts, chat and /tokenize answer 400 saying to send token ids; presets too large for host
random weights, unknown presets and head-based speculation are refused at start-up with the
reason; --tokenizer gives it text; scripts/bench_serve.py drives it with --token-id-range (and joins runs with merge).

Run (repository root): ARBOR_BIN=build/server/arbor python3 tests/server/test_dummy_model.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ARBOR_BIN, SHARED, ArborServer, free_port, raw  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "bench_serve.py")


class DummyServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = ArborServer(["--kv-blocks", "256", "--threads", "1"], model="dummy:tiny",
                              grpc=False).start()

    @classmethod
    def tearDownClass(cls):
        code = cls.srv.stop()
        assert code == 0, f"server exited with {code}:\n{cls.srv.output()}"

    def post(self, path, body):
        return raw(self.srv.port, "POST", path, body)

    def test_models_lists_the_preset(self):
        status, d = raw(self.srv.port, "GET", "/v1/models")
        self.assertEqual(status, 200, d)
        self.assertEqual(d["data"][0]["id"], "dummy:tiny")

    def test_token_id_completion_runs_to_max_tokens(self):
        status, d = self.post("/v1/completions", {"prompt": [5, 6, 7, 300], "max_tokens": 9,
                                                  "ignore_eos": True, "temperature": 0})
        self.assertEqual(status, 200, d)
        self.assertEqual(d["usage"]["prompt_tokens"], 4)
        self.assertEqual(d["usage"]["completion_tokens"], 9)
        self.assertEqual(d["choices"][0]["finish_reason"], "length")
        # " <id>" per generated token (the ids themselves).
        ids = [int(x) for x in d["choices"][0]["text"].split()]
        self.assertEqual(len(ids), 9)
        self.assertTrue(all(0 <= i < 512 for i in ids), ids)

    def test_stream_carries_text_per_token(self):
        # BOS (1) and EOS (2) stream no text (special tokens are left out of it): banned, so that
        # every token shows as one " <id>" word.
        conn_body = {"prompt": [[9, 10], [11]], "max_tokens": 5, "ignore_eos": True,
                     "logit_bias": {"1": -100, "2": -100},
                     "stream": True, "stream_options": {"include_usage": True}}
        status, text = self.post("/v1/completions", conn_body)
        self.assertEqual(status, 200, text)
        chunks = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: {")]
        # Every token streams its " <id>" (a chunk may carry several when the client lags).
        text = {0: "", 1: ""}
        for c in chunks:
            for choice in c["choices"]:
                text[choice["index"]] += choice["text"]
        self.assertEqual([len(t.split()) for t in text.values()], [5, 5], text)
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 10)

    def test_text_prompt_chat_and_tokenize_are_400(self):
        for path, body, words in (
                ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4},
                 "send the prompt as token ids"),
                ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 4}, "token ids"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                 "no chat template"),
                ("/tokenize", {"prompt": "hello"}, "token ids")):
            status, d = self.post(path, body)
            self.assertEqual(status, 400, (path, d))
            self.assertIn(words, d["error"]["message"], (path, d))
        # The server keeps serving.
        status, d = self.post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        self.assertEqual(status, 200, d)

    def test_out_of_vocabulary_id_is_400(self):
        status, d = self.post("/v1/completions", {"prompt": [5, 512], "max_tokens": 2})
        self.assertEqual(status, 400, d)
        self.assertIn("512", d["error"]["message"])

    def test_bench_serve_with_token_id_range(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            p = subprocess.run([sys.executable, SCRIPT, "--base-url", self.srv.base_url,
                                "--dataset", "random", "--token-id-range", "3:512",
                                "--random-input-len", "24", "--random-output-len", "6",
                                "--num-prompts", "6", "--concurrency", "2", "--ignore-eos",
                                "--warmup", "1", "--result-json", out],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as f:
                level = json.load(f)["levels"][0]
            # merge: one result from several runs, levels in order, relabelled.
            joined, joined_csv = os.path.join(tmp, "j.json"), os.path.join(tmp, "j.csv")
            p = subprocess.run([sys.executable, SCRIPT, "merge", out, out, "--out", joined,
                                "--csv", joined_csv, "--label", "both"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(joined) as f:
                merged = json.load(f)
            self.assertEqual(merged["label"], "both")
            self.assertEqual([lv["label"] for lv in merged["levels"]], ["both", "both"])
            self.assertEqual(merged["levels"][1]["completed"], 6)
            with open(joined_csv) as f:
                self.assertEqual(len(f.read().strip().splitlines()), 3)  # header + 2 levels
        self.assertEqual(level["completed"], 6)
        for r in level["requests"]:
            self.assertEqual(r["input_tokens"], 24)
            self.assertEqual(r["output_tokens"], 6)
        for flags, words in ((["--token-id-range", "5:5"], "--token-id-range"),
                             (["--token-id-range", "0:9", "--endpoint", "chat"],
                              "--token-id-range")):
            p = subprocess.run([sys.executable, SCRIPT, "--base-url", self.srv.base_url,
                                "--dataset", "random"] + flags,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(words, p.stderr)


class DummyWithTokenizer(unittest.TestCase):
    def test_tokenizer_flag_gives_text(self):
        tok = os.path.join(SHARED, "models", "stories260K", "tok512.bin")
        with ArborServer(["--kv-blocks", "64", "--threads", "1", "--tokenizer", tok],
                         model="dummy:tiny", grpc=False) as srv:
            status, d = raw(srv.port, "POST", "/v1/completions",
                            {"prompt": "Once upon a time", "max_tokens": 3, "ignore_eos": True})
            self.assertEqual(status, 200, d)
            self.assertEqual(d["usage"]["completion_tokens"], 3)
            status, d = raw(srv.port, "POST", "/tokenize", {"prompt": "Once upon a time"})
            self.assertEqual(status, 200, d)


class RefusedAtStartup(unittest.TestCase):
    def serve(self, *args):
        return subprocess.run([ARBOR_BIN, "serve", "--port", str(free_port()), "--grpc-port",
                               "0"] + list(args), capture_output=True, text=True, timeout=60)

    def test_refusals_name_the_reason(self):
        for args, words in (
                (["--model", "dummy:llama-3-8b"], "--backend cuda"),
                (["--model", "dummy:llama-9"], "presets: llama-3-8b, llama-3-70b, tiny"),
                (["--model", "dummy:tiny", "--spec", "medusa", "--spec-heads", "x"],
                 "no trained heads")):
            p = self.serve(*args)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(words, p.stderr, args)


if __name__ == "__main__":
    unittest.main()
