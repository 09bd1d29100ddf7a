"""scripts/medusa_tree_from_stats.py against brute force: on random node statistics of small
Medusa trees, the list it writes for each size is best first: every prefix is ancestor-closed and
reaches the largest expected accepted length over every ancestor-closed subtree of its size
(enumerated);
stats without tree sizes are refused with a message.

Run: python3 tests/scripts/test_medusa_tree_from_stats.py
"""
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get("ARBOR_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "medusa_tree_from_stats.py")


def product_paths(widths):
    paths, frontier = [[]], [[]]
    for w in widths:
        frontier = [p + [r] for p in frontier for r in range(w)]
        paths += frontier
    return sorted(paths, key=lambda p: (len(p), p))


def random_stats(rng, paths, steps):
    """Greedy-consistent counts: each step's accepted path is a random walk down the tree."""
    children = {}
    for i, p in enumerate(paths):
        if p:
            children.setdefault(tuple(p[:-1]), []).append(i)
    # rank-biased child probabilities, some mass on stopping
    weights = {i: rng.random() / (1 + paths[i][-1]) ** rng.uniform(0.5, 2) for i in range(1, len(paths))}
    on_path = [0] * len(paths)
    in_tree = [0] * len(paths)
    for _ in range(steps):
        size = rng.choice([len(paths), len(paths), rng.randint(1, len(paths))])  # budget cuts
        for i in range(size):
            in_tree[i] += 1
        node, prefix = 0, ()
        on_path[0] += 1
        while True:
            kids = [k for k in children.get(prefix, []) if k < size]
            stop = rng.random() * 1.5
            total = sum(weights[k] for k in kids)
            if not kids or stop > total:
                break
            x = rng.random() * total
            for k in kids:
                x -= weights[k]
                if x <= 0:
                    break
            node, prefix = k, tuple(paths[k])
            on_path[node] += 1
    return on_path, in_tree


def rates(paths, on_path, in_tree):
    index = {tuple(p): i for i, p in enumerate(paths)}
    r = [0.0] * len(paths)
    for i, p in enumerate(paths):
        r[i] = on_path[i] / in_tree[i] if in_tree[i] else 0.0
        if p:
            r[i] = min(r[i], r[index[tuple(p[:-1])]])
    return r


def brute_best(paths, rate, nodes):
    if nodes == 1:
        return 1.0
    best = -1.0
    for subset in itertools.combinations(range(1, len(paths)), nodes - 1):
        chosen = {tuple(paths[i]) for i in subset}
        if all(tuple(paths[i][:-1]) in chosen or len(paths[i]) == 1 for i in subset):
            best = max(best, sum(rate[i] for i in subset))
    return 1.0 + best


class TreeFromStats(unittest.TestCase):
    def run_script(self, stats, nodes, out_dir):
        with open(os.path.join(out_dir, "stats.json"), "w") as f:
            json.dump(stats, f)
        return subprocess.run([sys.executable, SCRIPT, os.path.join(out_dir, "stats.json"),
                               "--nodes", *map(str, nodes), "--out-dir", out_dir],
                              capture_output=True, text=True, timeout=120)

    def test_best_subtree_matches_brute_force(self):
        rng = random.Random(7)
        for widths in ([3, 2, 2], [4, 2], [2, 2, 2]):
            paths = product_paths(widths)
            on_path, in_tree = random_stats(rng, paths, 400)
            rate = rates(paths, on_path, in_tree)
            nodes = [2, 4, 6, 8]
            with tempfile.TemporaryDirectory() as d:
                r = self.run_script({"paths": paths, "on_path": on_path, "in_tree": in_tree,
                                     "steps": 400, "tree": str(widths)}, nodes, d)
                self.assertEqual(r.returncode, 0, r.stderr)
                for n in nodes:
                    with open(os.path.join(d, f"medusa_{n}.json")) as f:
                        choices = json.load(f)
                    self.assertEqual(len(choices), n - 1)
                    # best first, parents before children: every prefix is the best of its size
                    for k in range(1, n):
                        prefix = choices[:k - 1]
                        got = {tuple(p) for p in prefix}
                        for p in prefix:
                            self.assertTrue(len(p) == 1 or tuple(p[:-1]) in got, (p, prefix))
                        value = 1.0 + sum(rate[paths.index(p)] for p in prefix)
                        self.assertAlmostEqual(value, brute_best(paths, rate, k), places=9,
                                               msg=f"{widths} N={n}, prefix {k}: {prefix}")
                    # the printed expectation is the tree's own
                    line = [x for x in r.stdout.splitlines() if x.strip().startswith(f"{n} nodes")]
                    self.assertEqual(len(line), 1, r.stdout)
                    self.assertIn(f"{1.0 + sum(rate[paths.index(p)] for p in choices):.3f}",
                                  line[0])

    def test_refuses_stats_without_tree_sizes(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_script({"paths": [[], [0]], "on_path": [3, 1], "steps": 3}, [2], d)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("tree size", r.stderr)

    def test_refuses_a_size_larger_than_the_tree(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_script({"paths": [[], [0]], "on_path": [3, 1], "in_tree": [3, 3],
                                 "steps": 3}, [5], d)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--nodes 5", r.stderr)


if __name__ == "__main__":
    unittest.main()
