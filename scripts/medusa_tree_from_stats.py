#!/usr/bin/env python3
"""Medusa static trees from measured node acceptance (`arbor spec-bench --node-stats FILE`).

Under greedy verification a tree node is accepted exactly when it lies on the target's own
continuation and all its ancestors are in the tree, so the expected accepted length of any
ancestor-closed subtree S of the measured tree is the sum over v in S of p(v), the probability
that v's path is the target's own: measured as on_path[v] / in_tree[v] (steps that accepted v over
steps whose tree, cut to the step's budget, held v). A child is never on the path more often than
its parent; the measured rates are made to agree (p(v) <= p(parent)), so the best subtree of N
nodes is the root plus the N - 1 nodes of highest p (ties: shallower first, then Medusa order).

  arbor spec-bench ... --spec medusa --spec-tree product-10-6-3-2 --spec-max-nodes 640 \\
      --skip-plain --node-stats /tmp/stats.json          # calibration prompts, greedy
  python3 scripts/medusa_tree_from_stats.py /tmp/stats.json --nodes 16 24 32 48 --out-dir D

writes D/medusa_N.json (a choices list as --spec-tree takes, best path first, so that a budget's
cut keeps the best subtree) for each N and prints each tree's expected tokens per step (accepted +
1).
"""
import argparse
import json
import os
import sys


def node_rates(paths, on_path, in_tree):
    """p(v) per node: on_path / in_tree (0 when never offered), capped by the parent's."""
    index = {tuple(p): i for i, p in enumerate(paths)}
    rate = [0.0] * len(paths)
    for i, p in enumerate(paths):  # parents precede children (Medusa order)
        offered = in_tree[i] if i < len(in_tree) else 0
        hits = on_path[i] if i < len(on_path) else 0
        rate[i] = hits / offered if offered > 0 else 0.0
        if p:
            rate[i] = min(rate[i], rate[index[tuple(p[:-1])]])
    return rate


def best_subtree(paths, rate, nodes):
    """The nodes - 1 non-root paths of the best ancestor-closed subtree, best first (parents
    before children): any prefix of the list is the best subtree of its size, which is how
    arbor cuts a listed tree to a step's budget (StaticTree::listed)."""
    order = sorted(range(1, len(paths)), key=lambda i: (-rate[i], len(paths[i]), paths[i]))
    chosen = order[:max(0, nodes - 1)]
    picked = {tuple(paths[i]) for i in chosen}
    for i in chosen:  # ancestor-closed by construction; checked, not assumed
        p = paths[i]
        for d in range(1, len(p)):
            if tuple(p[:d]) not in picked:
                raise ValueError(f"path {p} picked without its ancestor {p[:d]}")
    expected = 1.0 + sum(rate[i] for i in chosen)
    return [list(paths[i]) for i in chosen], expected


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stats", help="spec-bench --node-stats output (Medusa, greedy)")
    ap.add_argument("--nodes", type=int, nargs="+", required=True,
                    help="tree sizes including the root")
    ap.add_argument("--out-dir", help="write medusa_N.json here")
    args = ap.parse_args()
    with open(args.stats) as f:
        st = json.load(f)
    if not st.get("paths"):
        sys.exit(f"{args.stats}: no tree paths (node stats of a Medusa run are needed)")
    if st.get("temperature", 0) != 0:
        print("warning: stats from sampled verification; the greedy model is an approximation",
              file=sys.stderr)
    paths, steps = st["paths"], st["steps"]
    if not st.get("in_tree") or st["in_tree"][0] <= 0:
        sys.exit(f"{args.stats}: no verify steps with a known tree size")
    rate = node_rates(paths, st["on_path"], st["in_tree"])
    print(f"{args.stats}: {steps} steps ({st['in_tree'][1] if len(st['in_tree']) > 1 else 0} "
          f"with a tree) over the {len(paths)}-node tree {st.get('tree', '?')}")
    for n in args.nodes:
        if n < 1 or n > len(paths):
            sys.exit(f"--nodes {n}: must be in [1, {len(paths)}] (the measured tree's size)")
        choices, expected = best_subtree(paths, rate, n)
        depth = max((len(p) for p in choices), default=0)
        print(f"{n:4d} nodes: expected tokens per step {expected:.3f}, depth {depth}")
        if args.out_dir:
            os.makedirs(args.out_dir, exist_ok=True)
            with open(os.path.join(args.out_dir, f"medusa_{n}.json"), "w") as f:
                json.dump(choices, f, separators=(",", ":"))
                f.write("\n")


if __name__ == "__main__":
    main()
