#!/usr/bin/env python3
"""Summarises `bash scripts/gpu_bars.sh ncu-spec`'s ncu_spec.csv (ncu --csv, the metric
gpu__time_duration.sum of every kernel of a short spec-bench run, in launch order).

Engine steps are cut at the tree sampler's walk kernel (the end of a verify step's sampling);
within a step, the kernels before the first draft depth (the draft's backlog forward and its
roots), the draft depths (from the first draft_frontier_load to the last draft_frontier_select)
and the rest (the verify forward and its sampling) are reported with their kernel counts, summed
times and the costliest kernels. Kernels are timed one at a time under ncu, so the sums run above
what the replayed graphs take.

  python3 scripts/ncu_kernel_summary.py ncu_spec.csv [--step -3] [--top 16]
"""
import argparse
import collections
import csv
import re
import sys


def kernels(path):
    out, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "ID":
                header = row
                continue
            if header and len(row) == len(header):
                d = dict(zip(header, row))
                if d.get("Metric Name") != "gpu__time_duration.sum":
                    continue
                name = d["Kernel Name"].replace("void ", "").replace("<unnamed>", "anon")
                name = re.split(r"[(<]", name)[0].split("::")[-1]
                out.append((name, float(d["Metric Value"].replace(",", "")) / 1000.0))
    return out


def report(label, part, top):
    times = collections.Counter()
    counts = collections.Counter()
    for name, us in part:
        times[name] += us
        counts[name] += 1
    print(f"--- {label}: {len(part)} kernels, {sum(t for _, t in part):.1f} us")
    for name, us in times.most_common(top):
        print(f"    {name:<44} {counts[name]:4d} {us:9.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=-3,
                    help="which step (index among the walk-delimited steps; default -3)")
    ap.add_argument("--top", type=int, default=16)
    args = ap.parse_args()
    ks = kernels(args.csv)
    if not ks:
        sys.exit(f"{args.csv}: no gpu__time_duration.sum rows")
    walks = [i for i, (n, _) in enumerate(ks) if n == "walk_kernel"]
    print(f"{len(ks)} kernels, {sum(t for _, t in ks) / 1000:.1f} ms in all; {len(walks)} "
          "sampled steps")
    if len(walks) < 2:
        report("all kernels", ks, args.top)
        return
    starts = walks[:-1]
    i = args.step if args.step >= 0 else len(starts) + args.step
    if not 0 <= i < len(starts):
        sys.exit(f"--step {args.step}: {len(starts)} whole steps")
    step = ks[starts[i] + 1:walks[i + 1] + 1]
    loads = [j for j, (n, _) in enumerate(step) if n == "draft_frontier_load_kernel"]
    selects = [j for j, (n, _) in enumerate(step) if n == "draft_frontier_select_kernel"]
    print(f"step {i}: {len(step)} kernels, {sum(t for _, t in step):.1f} us")
    if loads and selects:
        report("before the first draft depth", step[:loads[0]], args.top)
        report(f"{len(selects)} draft depths", step[loads[0]:selects[-1] + 1], args.top)
        report("verify forward and sampling", step[selects[-1] + 1:], args.top)
    else:
        report("the step", step, args.top)


if __name__ == "__main__":
    main()
