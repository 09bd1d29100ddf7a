#!/usr/bin/env python3
"""Joins the attention benchmarks of one GPU run into one markdown table (docs/performance.md
"Paged tree attention (H200)" and its appendix): our kernel (attention_bench logs, wgmma and
mma.sync), PyTorch SDPA with the tree mask and FlexAttention (torch_attention_bench.py JSON),
FlashInfer's custom mask (flashinfer_attention_bench.py JSON). Prints the table and, per peer,
how many points we are faster at and the smallest / largest ratio (peer time / ours).

    python3 scripts/attention_peers_table.py --ours bench_wgmma.log [--mma bench_mma.log]
        [--torch torch_attention.json] [--flashinfer flashinfer_attention.json]
"""
import argparse
import json


def read_bench_log(path):
    """attention_bench's markdown rows -> {(B, L, T): (splits, us, floor_us, bound)}."""
    rows = {}
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 8 or not cells[0].isdigit():
                continue
            b, l, t, splits = map(int, cells[:4])
            rows[(b, l, t)] = (splits, float(cells[5]), float(cells[6]), cells[8])
    return rows


def read_json_rows(path, key):
    with open(path) as f:
        data = json.load(f)
    results = data["results"] if isinstance(data, dict) else data
    out = {}
    for r in results:
        if isinstance(r.get(key), (int, float)):
            out[(r["batch"], r["context"], r["tree"])] = float(r[key])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="attention_bench logs, comma-separated")
    ap.add_argument("--mma", default="")
    ap.add_argument("--torch", default="")
    ap.add_argument("--flashinfer", default="")
    a = ap.parse_args()
    ours = {}
    for path in a.ours.split(","):  # e.g. the grid and the extra points
        ours.update(read_bench_log(path))
    mma = read_bench_log(a.mma) if a.mma else {}
    sdpa = read_json_rows(a.torch, "sdpa_us") if a.torch else {}
    flex = read_json_rows(a.torch, "flex_us") if a.torch else {}
    if a.torch:  # FlexAttention compile failures are reported as such
        with open(a.torch) as f:
            for r in json.load(f):
                if "flex_error" in r:
                    flex[(r["batch"], r["context"], r["tree"])] = r["flex_error"].split(":")[0]
    fi = read_json_rows(a.flashinfer, "flashinfer_us") if a.flashinfer else {}

    print("| B | L | T | splits | ours (wgmma) us | floor us | x floor | ours mma.sync us "
          "| FlashInfer custom mask us | FlashInfer / ours | SDPA + tree mask us | SDPA / ours "
          "| FlexAttention us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = {"FlashInfer": [], "SDPA": []}
    fmt = lambda v: "-" if v is None else v if isinstance(v, str) else f"{v:.1f}"
    for key in sorted(ours):
        splits, us, floor, _ = ours[key]
        f_us, s_us = fi.get(key), sdpa.get(key)
        if f_us is not None:
            ratios["FlashInfer"].append((f_us / us, key))
        if s_us is not None:
            ratios["SDPA"].append((s_us / us, key))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {splits} | {us:.1f} | {floor:.1f} "
              f"| {us / floor:.2f} | {fmt(mma.get(key, (0, None))[1])} | {fmt(f_us)} "
              f"| {f'{f_us / us:.2f}x' if f_us else '-'} | {fmt(s_us)} "
              f"| {f'{s_us / us:.2f}x' if s_us else '-'} | {fmt(flex.get(key))} |")
    print()
    # The floor bars: every point within 1.6x, memory-bound points within 1.3x.
    within = sum(1 for v in ours.values() if v[1] <= 1.6 * v[2])
    mem = [v for v in ours.values() if v[3] == "mem"]
    mem_within = sum(1 for v in mem if v[1] <= 1.3 * v[2])
    print(f"* floor: {within} of {len(ours)} points within 1.6x; {mem_within} of {len(mem)} "
          f"memory-bound points within 1.3x")
    for peer, rs in ratios.items():
        if not rs:
            continue
        faster = sum(1 for r, _ in rs if r > 1)
        lo, hi = min(rs), max(rs)
        four = sum(1 for r, _ in rs if r >= 4)
        print(f"* {peer}: ours faster at {faster} of {len(rs)} points, at least 4x at {four}; "
              f"peer / ours from {lo[0]:.2f}x at {lo[1]} to {hi[0]:.2f}x at {hi[1]}")


if __name__ == "__main__":
    main()
