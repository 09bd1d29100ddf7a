#!/usr/bin/env python3
"""Peers of the paged tree-attention kernel at the same Llama-3-8B points (issue 4 item 4):
PyTorch SDPA with a dense boolean tree mask and FlexAttention with a tree mask_mod.

Shapes: 32 query heads, 8 KV heads (GQA), head_dim 128, bf16; batch B requests, each with a
committed prefix of L keys and a random tree of T nodes (parents within 10 of the node, as in
attention_bench). The peers read contiguous K/V [B, 8, L + T, 128] (they have no paged-KV
form); our kernel reads paged K/V through scrambled block tables. Median of triton's do_bench
(cold L2 not forced: K/V of the larger points exceed the 50 MB L2 anyway).

    python3 tests/cuda/torch_attention_bench.py [--flex-budget-s 200] [--out results.json]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

HQ, HKV, D = 32, 8, 128


def random_tree_ancestors(t, gen):
    parent = [-1] + [int(torch.randint(max(0, i - 10), i, (1,), generator=gen)) for i in range(1, t)]
    anc = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parent[j]
    return anc


def make_inputs(b, l, t, gen):
    q = torch.randn(b, HQ, t, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, HKV, l + t, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, HKV, l + t, D, dtype=torch.bfloat16, device="cuda")
    anc = torch.stack([random_tree_ancestors(t, gen) for _ in range(b)]).cuda()  # [B, T, T]
    return q, k, v, anc


def sdpa_time(q, k, v, anc, l):
    b, _, t, _ = q.shape
    mask = torch.ones(b, 1, t, l + t, dtype=torch.bool, device="cuda")
    mask[:, 0, :, l:] = anc
    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    fn()
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def flex_time(q, k, v, anc, l):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, _, t, _ = q.shape

    def tree_mask(bi, h, q_idx, kv_idx):
        node = kv_idx - l
        return (kv_idx < l) | ((node >= 0) & anc[bi, q_idx, node.clamp(min=0)])

    block_mask = create_block_mask(tree_mask, b, None, t, l + t, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    fn = lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True)
    fn()
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,8,16,32,64")
    ap.add_argument("--context", default="1024,2048,8192,32768")
    ap.add_argument("--tree", default="16,32,64,128")
    ap.add_argument("--flex-points", default="1x2048x16,1x32768x16,8x2048x64,16x2048x64,32x4096x32,"
                    "8x8192x128,32x8192x16,64x2048x16,64x8192x64,64x32768x16")
    ap.add_argument("--flex-budget-s", type=float, default=200)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    try:
        import flashinfer  # noqa: F401
        print("flashinfer: importable")
    except Exception as e:  # noqa: BLE001
        print(f"flashinfer: not available ({type(e).__name__}: {e})")
    grid = [(b, l, t) for b in map(int, a.batch.split(",")) for l in map(int, a.context.split(","))
            for t in map(int, a.tree.split(","))]
    grid += [(32, 4096, 32)]  # one of the quoted SDPA points
    flex_points = {tuple(map(int, p.split("x"))) for p in a.flex_points.split(",") if p}
    results = []
    print("| B | L | T | SDPA (tree mask) us | FlexAttention (mask_mod) us |\n|---|---|---|---|---|")
    t_flex = 0.0
    for b, l, t in grid:
        q, k, v, anc = make_inputs(b, l, t, gen)
        row = {"batch": b, "context": l, "tree": t}
        try:
            row["sdpa_us"] = sdpa_time(q, k, v, anc, l)
        except Exception as e:  # noqa: BLE001
            row["sdpa_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        if (b, l, t) in flex_points and t_flex < a.flex_budget_s:
            t0 = time.time()
            try:
                row["flex_us"] = flex_time(q, k, v, anc, l)
            except Exception as e:  # noqa: BLE001
                row["flex_error"] = f"{type(e).__name__}: {str(e)[:120]}"
            t_flex += time.time() - t0
        results.append(row)
        fmt = lambda key: f"{row[key]:.1f}" if key in row else row.get(key.replace("_us", "_error"), "-")
        print(f"| {b} | {l} | {t} | {fmt('sdpa_us')} | {fmt('flex_us')} |", flush=True)
        del q, k, v, anc
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
