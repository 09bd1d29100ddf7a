"""scripts/bench_serve.py against a real `arbor serve` (stories260K, n-gram speculation, CPU):
short open-loop and closed-loop runs on each dataset (MT-bench prompts, random lengths, shared
prefix) over completions and chat, checked against facts the benchmark does not compute itself:
the server's own request count and TTFT / end-to-end sums from /metrics, output token counts
equal to the requested max_tokens (ignore_eos), prompt token counts the server reports, the
concurrency limits seen in the request timeline, percentiles recomputed from the per-request
records, goodput <= throughput, and the JSON and CSV files agreeing. Also the arrival process
(gamma gaps: mean 1/rate, coefficient of variation 1/sqrt(burstiness)) and the plot command.

Run (repository root): ARBOR_SHARED_DIR=../shared python3 tests/server/test_bench_serve.py
"""
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ArborServer, SHARED  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "bench_serve.py")
CHATML = os.path.join(REPO, "tests", "data", "chat_templates", "smollm2.jinja")
MT_BENCH = os.path.join(SHARED, "data", "prompts", "mt_bench.jsonl")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import bench_serve  # noqa: E402


def histogram(metrics, name):
    """(sum, count) of a Prometheus histogram from ArborServer.metrics()."""
    return metrics.get(name + "_sum", 0.0), metrics.get(name + "_count", 0.0)


def max_overlap(requests):
    """Most requests in flight at once, from their [start, start + e2el] intervals."""
    events = []
    for r in requests:
        events.append((r["start"], 1))
        events.append((r["start"] + r["e2el"], -1))
    events.sort(key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


class BenchServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="bench_serve_test_")
        # MT-bench first turns short enough for stories260K's 512-token context.
        cls.mt_subset = os.path.join(cls.tmp.name, "mt_bench_short.jsonl")
        with open(MT_BENCH) as src, open(cls.mt_subset, "w") as dst:
            for line in src:
                if line.strip() and len(json.loads(line)["turns"][0]) < 300:
                    dst.write(line)
        cls.srv = ArborServer(["--kv-blocks", "1024", "--max-running", "16", "--chat-template",
                               CHATML, "--spec", "ngram", "--spec-adaptive", "false"],
                              grpc=False).start()

    @classmethod
    def tearDownClass(cls):
        code = cls.srv.stop()
        cls.tmp.cleanup()
        assert code == 0, f"server exited with {code}:\n{cls.srv.output()}"

    def bench(self, name, *flags):
        """Runs the benchmark CLI; returns (result JSON, CSV rows, wall seconds, server metric
        deltas: requests, TTFT sum, e2e sum)."""
        out_json = os.path.join(self.tmp.name, name + ".json")
        out_csv = os.path.join(self.tmp.name, name + ".csv")
        before = self.srv.metrics()
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, SCRIPT, "--base-url", self.srv.base_url,
                            "--warmup", "0", "--ignore-eos", "--result-json", out_json,
                            "--result-csv", out_csv] + list(flags),
                           capture_output=True, text=True, timeout=120)
        wall = time.perf_counter() - t0
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        after = self.srv.metrics()
        with open(out_json) as f:
            result = json.load(f)
        with open(out_csv) as f:
            rows = list(csv.DictReader(f))
        ttft0, n0 = histogram(before, "arbor_time_to_first_token_seconds")
        ttft1, n1 = histogram(after, "arbor_time_to_first_token_seconds")
        e2e0, _ = histogram(before, "arbor_e2e_request_latency_seconds")
        e2e1, _ = histogram(after, "arbor_e2e_request_latency_seconds")
        server = {"requests": n1 - n0, "ttft_sum": ttft1 - ttft0, "e2e_sum": e2e1 - e2e0}
        return result, rows, wall, server

    def check(self, result, rows, wall, server, num_prompts, modes):
        levels = result["levels"]
        self.assertEqual([lv["mode"] for lv in levels], modes)
        # The CSV holds the JSON's levels, value for value.
        self.assertEqual(len(rows), len(levels))
        for row, lv in zip(rows, levels):
            for key, text in row.items():
                value = lv.get(key)
                if value is None:
                    self.assertEqual(text, "", key)
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.assertAlmostEqual(float(text), value, places=6, msg=key)
                else:
                    self.assertEqual(text, str(value), key)
        # The server answered exactly the requests the levels report, and its TTFT and e2e
        # (arrival to first token / to the end) lie inside the client's.
        client_ttft = sum(r["ttft"] for lv in levels for r in lv["requests"])
        client_e2e = sum(r["e2el"] for lv in levels for r in lv["requests"])
        self.assertEqual(server["requests"], num_prompts * len(levels))
        self.assertLessEqual(server["ttft_sum"], client_ttft + 1e-3)
        self.assertLessEqual(server["e2e_sum"], client_e2e + 1e-3)
        self.assertLessEqual(sum(lv["duration_s"] for lv in levels), wall)
        for lv in levels:
            reqs = lv["requests"]
            self.assertEqual((lv["completed"], lv["failed"], len(reqs)), (num_prompts, 0,
                                                                          num_prompts))
            for r in reqs:
                self.assertIsNone(r["error"])
                self.assertEqual(r["output_tokens"], r["max_tokens"])  # ignore_eos
                self.assertGreater(r["ttft"], 0)
                self.assertLessEqual(r["ttft"], r["e2el"])
                self.assertLessEqual(r["start"] + r["e2el"], lv["duration_s"] + 1e-3)
                self.assertEqual(len(r["itl"]), r["chunks"] - 1)
                self.assertLessEqual(r["ttft"] + sum(r["itl"]), r["e2el"] + 1e-5)
                self.assertLessEqual(r["chunks"], r["output_tokens"])
                self.assertAlmostEqual(r["tpot"], (r["e2el"] - r["ttft"]) /
                                       (r["output_tokens"] - 1), delta=2e-6)
                spec = r["speculation"]
                self.assertLessEqual(spec["decode_steps"], r["output_tokens"])
            self.assertEqual(lv["total_output_tokens"], sum(r["output_tokens"] for r in reqs))
            self.assertEqual(lv["total_input_tokens"], sum(r["input_tokens"] for r in reqs))
            self.assertAlmostEqual(lv["request_throughput"], num_prompts / lv["duration_s"])
            self.assertAlmostEqual(lv["output_throughput"],
                                   lv["total_output_tokens"] / lv["duration_s"])
            # Percentiles ordered, and recomputed from the records (statistics.median).
            series = {"ttft": [r["ttft"] for r in reqs], "e2el": [r["e2el"] for r in reqs],
                      "tpot": [r["tpot"] for r in reqs],
                      "itl": [x for r in reqs for x in r["itl"]]}
            for name, values in series.items():
                med, p90, p99 = (lv[f"{s}_{name}_ms"] for s in ("median", "p90", "p99"))
                self.assertLessEqual(med, p90, name)
                self.assertLessEqual(p90, p99, name)
                self.assertLessEqual(p99, max(values) * 1e3 + 1e-3, name)
                self.assertAlmostEqual(med, statistics.median(values) * 1e3, delta=2e-3,
                                       msg=name)
                self.assertAlmostEqual(lv[f"mean_{name}_ms"], statistics.fmean(values) * 1e3,
                                       delta=2e-3, msg=name)
            # Goodput: requests meeting every SLO, per second; at most the throughput.
            if "request_goodput" in lv:
                slo = result["settings"]["goodput"]
                good = sum(all(r[k] * 1e3 <= ms for k, ms in slo.items()) for r in reqs)
                self.assertEqual(lv["good_requests"], good)
                self.assertLessEqual(lv["request_goodput"], lv["request_throughput"])
            # n-gram speculation: the server's acceptance length, at least one token a step.
            self.assertGreaterEqual(lv["mean_accepted_length"], 1.0)
            self.assertGreaterEqual(lv["mean_tokens_per_chunk"], 1.0)
            if lv["mode"] == "closed":
                self.assertLessEqual(max_overlap(reqs), lv["concurrency"])
            else:
                starts = [r["start"] for r in sorted(reqs, key=lambda r: r["index"])]
                if not lv["max_concurrency"]:
                    self.assertEqual(starts, sorted(starts))  # sent in arrival order
                else:
                    self.assertLessEqual(max_overlap(reqs), lv["max_concurrency"])
        return levels

    def test_mt_bench_completions(self):
        res, rows, wall, server = self.bench(
            "mt", "--dataset", "mt-bench", "--dataset-path", self.mt_subset, "--num-prompts", "8",
            "--max-tokens", "48", "--request-rate", "20", "--concurrency", "2",
            "--goodput", "ttft:200", "tpot:20")
        for lv in self.check(res, rows, wall, server, 8, ["open", "closed"]):
            # stories260K repeats itself: n-gram drafts are accepted, several tokens arrive in
            # one chunk, and TPOT (per token) falls below the mean gap between chunks.
            self.assertGreater(lv["accepted_draft_tokens"], 0)
            self.assertGreater(lv["mean_tokens_per_chunk"], 1.0)
            self.assertLess(lv["mean_tpot_ms"], lv["mean_itl_ms"] * 1.0001)

    def test_mt_bench_chat(self):
        res, rows, wall, server = self.bench(
            "mt_chat", "--endpoint", "chat", "--dataset-path", self.mt_subset,
            "--num-prompts", "6", "--max-tokens", "16", "--concurrency", "3",
            "--goodput", "e2el:5000")
        self.check(res, rows, wall, server, 6, ["closed"])

    def test_random_token_ids(self):
        res, rows, wall, server = self.bench(
            "random", "--dataset", "random", "--random-input-len", "64", "--random-output-len",
            "20", "--random-range-ratio", "0.5", "--num-prompts", "8", "--request-rate", "inf",
            "--max-concurrency", "3", "--concurrency", "4")
        for lv in self.check(res, rows, wall, server, 8, ["open", "closed"]):
            for r in lv["requests"]:
                # Token-id prompts: the server counts exactly the ids drawn, within the range.
                self.assertTrue(32 <= r["input_tokens"] <= 96, r["input_tokens"])
                self.assertTrue(10 <= r["max_tokens"] <= 30, r["max_tokens"])

    def test_random_chat(self):
        res, rows, wall, server = self.bench(
            "random_chat", "--endpoint", "chat", "--dataset", "random", "--random-input-len",
            "48", "--random-output-len", "16", "--num-prompts", "6", "--request-rate", "30",
            "--burstiness", "0.5")
        levels = self.check(res, rows, wall, server, 6, ["open"])
        # Text built to 48 tokens by /tokenize, plus the chat template's own tokens.
        self.assertTrue(all(r["input_tokens"] > 48 for r in levels[0]["requests"]))

    def test_shared_prefix(self):
        # Without speculation (a per-request override), so the prefix cache serves the shared
        # system prompts: arbor's speculative requests report no cached tokens.
        res, rows, wall, server = self.bench(
            "gsp", "--dataset", "shared-prefix", "--gsp-num-groups", "2",
            "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "128",
            "--gsp-question-len", "16", "--gsp-output-len", "16", "--request-rate", "40",
            "--concurrency", "3", "--extra-body", '{"speculate": false}')
        for lv in self.check(res, rows, wall, server, 8, ["open", "closed"]):
            self.assertEqual({r["input_tokens"] for r in lv["requests"]}, {144})
            self.assertEqual({r["group"] for r in lv["requests"]}, {0, 1})
            self.assertGreater(lv["total_cached_tokens"], 0)
            self.assertEqual(lv["mean_accepted_length"], 1.0)
            self.assertEqual(lv["accepted_draft_tokens"], 0)

    def test_shared_prefix_chat(self):
        res, rows, wall, server = self.bench(
            "gsp_chat", "--endpoint", "chat", "--dataset", "shared-prefix", "--gsp-num-groups",
            "2", "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "96",
            "--gsp-question-len", "12", "--gsp-output-len", "12", "--request-rate", "inf",
            "--concurrency", "2")
        for lv in self.check(res, rows, wall, server, 6, ["open", "closed"]):
            # System text of 96 tokens and a question of 12, plus the template's tokens.
            self.assertTrue(all(r["input_tokens"] > 108 for r in lv["requests"]))

    def test_bad_flags_are_named(self):
        for flags, words in ((["--goodput", "latency:5"], "--goodput"),
                             (["--request-rate", "0"], "--request-rate"),
                             (["--random-range-ratio", "1.5"], "--random-range-ratio")):
            p = subprocess.run([sys.executable, SCRIPT, "--base-url", self.srv.base_url] + flags,
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(words, p.stderr)

    def test_plot(self):
        a, _, _, _ = self.bench("plot_on", "--dataset-path", self.mt_subset, "--num-prompts",
                                "4", "--max-tokens", "12", "--concurrency", "1,2")
        b, _, _, _ = self.bench("plot_off", "--dataset-path", self.mt_subset, "--num-prompts",
                                "4", "--max-tokens", "12", "--concurrency", "1,2",
                                "--extra-body", '{"speculate": false}')
        out = os.path.join(self.tmp.name, "plots")
        p = subprocess.run([sys.executable, SCRIPT, "plot",
                            os.path.join(self.tmp.name, "plot_on.json"),
                            os.path.join(self.tmp.name, "plot_off.json"),
                            "--labels", "on,off", "--out-dir", out],
                           capture_output=True, text=True, timeout=120)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("matplotlib", p.stderr)
            return
        self.assertEqual(p.returncode, 0, p.stderr)
        for name in ("latency_throughput", "ttft_cdf", "itl_cdf", "comparison"):
            with open(os.path.join(out, name + ".png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class Arrivals(unittest.TestCase):
    def test_gamma_gaps(self):
        rng = random.Random(7)
        for rate, burstiness in ((4.0, 1.0), (10.0, 0.25), (2.0, 4.0)):
            t = bench_serve.arrival_offsets(rng, 20001, rate, burstiness)
            gaps = [b - a for a, b in zip(t, t[1:])]
            mean = statistics.fmean(gaps)
            cv = statistics.pstdev(gaps) / mean
            self.assertAlmostEqual(mean, 1 / rate, delta=0.05 / rate)
            self.assertAlmostEqual(cv, burstiness ** -0.5, delta=0.08 * burstiness ** -0.5)
        self.assertEqual(bench_serve.arrival_offsets(rng, 5, float("inf"), 1.0), [0.0] * 5)

    def test_percentile_matches_numpy_linear(self):
        xs = [5.0, 1.0, 4.0, 2.0, 3.0]
        self.assertEqual(bench_serve.percentile(xs, 50), 3.0)
        self.assertAlmostEqual(bench_serve.percentile(xs, 90), 4.6)
        self.assertAlmostEqual(bench_serve.percentile(xs, 99), 4.96)


if __name__ == "__main__":
    unittest.main(verbosity=2)
