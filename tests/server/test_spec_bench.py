"""`arbor spec-bench` on the CPU backend (stories260K, the story openers): its table row, the
per-round lines of --rounds, the speculative and plain outputs identical (greedy), the flags
--plain-first, --no-spec-warmup, --plain-after-release and --time-graphs, Medusa's per-node acceptance
(--node-stats: consistent counts, and scripts/medusa_tree_from_stats.py turns them into a tree
spec-bench takes), an EAGLE token map built by scripts/make_token_map.py from a server's
replies, and a bad value named in the error.

Run (repository root): ARBOR_BIN=build/server/arbor python3 tests/server/test_spec_bench.py
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from arbor_server import ARBOR_BIN, SHARED  # noqa: E402

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SHARED, "models", "stories260K", "stories260K.bin")
PROMPTS = os.path.join(REPO, "scripts", "data", "story_openers.txt")


HEADS = os.path.join(REPO, "tests", "data", "heads", "stories260K")
TREE_SCRIPT = os.path.join(REPO, "scripts", "medusa_tree_from_stats.py")


def spec_bench(*args, spec=("--spec", "ngram")):
    cmd = [ARBOR_BIN, "spec-bench", "-m", MODEL, "--prompts", PROMPTS, "--limit", "4",
           "--max-tokens", "24", "--threads", "1", *spec, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


class SpecBench(unittest.TestCase):
    def check_rounds(self, out, rounds):
        row = [line for line in out.splitlines() if line.startswith("| ngram")]
        self.assertEqual(len(row), 1, out)
        # greedy: every speculative output equals its plain one
        self.assertIn("| 4/4 |", row[0], out)
        m = re.search(r"^rounds: speedup (.*) \(median ([0-9.]+)x\)$", out, re.M)
        self.assertIsNotNone(m, out)
        self.assertEqual(len(m.group(1).split(", ")), rounds, out)
        m = re.search(r"^rounds: spec / plain tok/s (.*)$", out, re.M)
        self.assertIsNotNone(m, out)
        pairs = m.group(1).split(", ")
        self.assertEqual(len(pairs), rounds, out)
        for p in pairs:
            spec, plain = (int(x) for x in p.split(" / "))
            self.assertGreater(spec, 0, out)
            self.assertGreater(plain, 0, out)
        self.assertIn("spec: ", out)
        self.assertIn("plain: ", out)
        # "other" split into the engine's host stages and what is outside its step: the parts
        # are not negative and add up to the step line's "other" (printed to 0.001 ms).
        for what in ("spec", "plain"):
            m = re.search(r"^%s: .* \+ other (-?[0-9.]+);" % what, out, re.M)
            self.assertIsNotNone(m, out)
            parts = re.search(r"^%s other: per step (.*)$" % what, out, re.M)
            self.assertIsNotNone(parts, out)
            values = [float(v) for v in re.findall(r"(-?[0-9]+\.[0-9]+)", parts.group(1))]
            self.assertEqual(len(values), 8, parts.group(0))
            self.assertTrue(all(v >= -0.002 for v in values), parts.group(0))
            self.assertAlmostEqual(sum(values), float(m.group(1)), delta=0.01)

    def test_rounds_spec_first(self):
        r = spec_bench("--rounds", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.check_rounds(r.stdout, 2)

    def test_rounds_plain_first(self):
        r = spec_bench("--rounds", "3", "--plain-first", "--no-spec-warmup", "--gemm-report",
                       "--plain-after-release", "--time-graphs")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.check_rounds(r.stdout, 3)
        m = re.search(r"^plain after the draft was released: ([0-9.]+) tok/s", r.stdout, re.M)
        self.assertIsNotNone(m, r.stdout)
        self.assertGreater(float(m.group(1)), 0)
        self.assertIn("plain after release: ", r.stdout)
        # the CPU backend chooses nothing at run time: the report is its heading alone
        self.assertIn("target choices:\nplain after the draft", r.stdout)
        # nor does it record step graphs: --time-graphs has no replay to time
        self.assertNotIn("step graphs on the device", r.stdout)

    def test_node_stats_feed_the_tree_script(self):
        with tempfile.TemporaryDirectory() as d:
            stats = os.path.join(d, "stats.json")
            r = spec_bench("--skip-plain", "--node-stats", stats, "--spec-tree", "product-4-2-2",
                           spec=("--spec", "medusa", "--spec-heads",
                                 os.path.join(HEADS, "medusa")))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(stats) as f:
                st = json.load(f)
            paths, on_path, in_tree = st["paths"], st["on_path"], st["in_tree"]
            self.assertEqual(len(paths), 1 + 4 + 8 + 16)  # product-4-2-2 with the root
            self.assertEqual(paths[0], [])
            self.assertEqual(on_path[0], st["steps"])  # the root is on every accepted path
            self.assertEqual(in_tree[0], st["steps"])
            self.assertGreater(sum(on_path[1:]), 0, st)  # the heads accept something
            index = {tuple(p): i for i, p in enumerate(paths)}
            for i, p in enumerate(paths):
                hits = on_path[i] if i < len(on_path) else 0
                self.assertLessEqual(hits, in_tree[i] if i < len(in_tree) else 0, p)
                if p:  # a node is accepted only after its parent
                    self.assertLessEqual(hits, on_path[index[tuple(p[:-1])]], p)
            m = re.search(r"^node stats: (\d+) steps, (\d+) nodes", r.stdout, re.M)
            self.assertIsNotNone(m, r.stdout)
            out = subprocess.run([sys.executable, TREE_SCRIPT, stats, "--nodes", "4", "8",
                                  "--out-dir", d], capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            with open(os.path.join(d, "medusa_8.json")) as f:
                tree = json.load(f)
            self.assertEqual(len(tree), 7)
            # the written tree is a valid --spec-tree for the same heads
            r = spec_bench("--skip-plain", "--spec-tree", os.path.join(d, "medusa_8.json"),
                           spec=("--spec", "medusa", "--spec-heads",
                                 os.path.join(HEADS, "medusa")))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| medusa |", r.stdout)

    def test_unwritable_node_stats_is_named_before_the_runs(self):
        r = spec_bench("--node-stats", "/nonexistent-dir/stats.json")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("--node-stats", r.stderr + r.stdout)
        self.assertIn("/nonexistent-dir/stats.json", r.stderr + r.stdout)
        self.assertNotIn("| ngram", r.stdout)  # refused before benchmarking

    def test_bad_rounds_is_named(self):
        r = spec_bench("--rounds", "0")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("--rounds", r.stderr + r.stdout)

    def test_token_map_from_the_models_own_replies(self):
        """scripts/make_token_map.py against a running server (the model's greedy completions of
        the story openers, their ids from /tokenize), then EAGLE with the map's first 96 ids: the
        draft vocabulary line, outputs identical to plain; a size past the map is named."""
        from arbor_server import ArborServer
        script = os.path.join(REPO, "scripts", "make_token_map.py")
        with tempfile.TemporaryDirectory() as d:
            replies, tmap = os.path.join(d, "replies.jsonl"), os.path.join(d, "map.json")
            with ArborServer(["--threads", "1"], model=MODEL, grpc=False) as srv:
                g = subprocess.run([sys.executable, script, "gen", "--url", srv.base_url + "/v1",
                                    "--prompts", PROMPTS, "--replies", replies, "--limit", "12",
                                    "--max-tokens", "48", "--concurrency", "4"],
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(g.returncode, 0, g.stderr)
            with open(replies) as f:
                rows = [json.loads(line) for line in f]
            self.assertEqual(len(rows), 12)
            self.assertTrue(all(r["ids"] and r["text"] for r in rows), rows[0])
            c = subprocess.run([sys.executable, script, "count", "--replies", replies,
                                "--vocab-size", "512", "--eos-id", "2", "--size", "128",
                                "--out", tmap], capture_output=True, text=True, timeout=60)
            self.assertEqual(c.returncode, 0, c.stderr)
            with open(tmap) as f:
                ids = json.load(f)["token_ids"]
            self.assertEqual(len(ids), 128)
            self.assertEqual(len(set(ids)), 128)
            counted = {}
            for r in rows:
                for t in r["ids"]:
                    counted[t] = counted.get(t, 0) + 1
            top = max(counted, key=lambda t: (counted[t], -t))
            self.assertEqual(ids[0], top)  # most frequent first
            eagle = ("--spec", "eagle", "--spec-heads", os.path.join(HEADS, "eagle"))
            r = spec_bench("--spec-token-map", tmap, "--spec-draft-vocab", "96", spec=eagle)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("EAGLE draft vocabulary: 96 of 512 target ids (token map " + tmap + ")",
                          r.stdout)
            row = [line for line in r.stdout.splitlines() if line.startswith("| eagle")]
            self.assertEqual(len(row), 1, r.stdout)
            self.assertIn("| 4/4 |", row[0], r.stdout)
            r = spec_bench("--spec-token-map", tmap, "--spec-draft-vocab", "1000", spec=eagle)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("1000 tokens asked for", r.stderr + r.stdout)
            self.assertIn("holds 128", r.stderr + r.stdout)


if __name__ == "__main__":
    unittest.main()
