#!/usr/bin/env python3
"""FlashInfer's paged prefill with a custom (tree) mask at the same Llama-3-8B points as
attention_bench (issue 4, peers): BatchPrefillWithPagedKVCacheWrapper, FA2 backend (the only
FlashInfer prefill backend with custom_mask on sm_90; FA3 rejects MaskMode.CUSTOM).

Shapes: 32 query heads, 8 KV heads (GQA), head_dim 128, bf16, page size 16; batch B requests,
each with a committed prefix of L keys and a random tree of T nodes (parents within 10 of the
node, as in attention_bench) whose K/V sit at the end of the request's L + T keys. K and V are
separate NHD page pools [num_pages, 16, 8, 128] read through scrambled page indices. The mask
is FlashInfer's custom_mask format: per request a [T, L + T] boolean matrix (prefix all True,
tree part ancestor-or-self), flattened and concatenated over requests; plan() packs it
(segment_packbits, little bit order). plan() runs once per point (its median over a few calls
is reported as plan_us: host scheduling + mask packing + H2D copies); run() is timed with
triton's do_bench median (it flushes L2 before each call by zeroing a 256 MB buffer).

The first call JIT-compiles FlashInfer's FA2 batch-prefill module (10 .cu files; ninja and nvcc
13 needed, CUDA_HOME or nvcc on PATH) and the segment_packbits module; the time is printed.

    python3 tests/cuda/flashinfer_attention_bench.py [--points 8x2048x64,32x4096x32]
        [--budget-s 600] [--out results.json] [--jit-only] [--no-check]
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

HQ, HKV, D = 32, 8, 128


def tree_ancestors(t, rng):
    """[t, t] bool: row i marks node i and its ancestors; parent of i is in [max(0, i-10), i-1]."""
    anc = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        if i > 0:
            anc[i] = anc[rng.randint(max(0, i - 10), i - 1)]
        anc[i, i] = True
    return anc


def kv_bytes(b, l, t, page):
    pages = b * math.ceil((l + t) / page)
    return 2 * pages * page * HKV * D * 2  # K and V pools, bf16


def est_bytes(b, l, t, page):
    # KV pools + Q/O + the unpacked bool mask (B*T*(L+T)) and its packed copy.
    return kv_bytes(b, l, t, page) + 2 * b * t * HQ * D * 2 + b * t * (l + t) * 9 // 8


def make_point(b, l, t, page, rng, gen, dev="cuda"):
    """Paged K/V with scrambled page indices, Q, metadata and the flattened custom mask."""
    kv_len = l + t
    pages_per_req = math.ceil(kv_len / page)
    num_pages = b * pages_per_req
    k_cache = torch.randn(num_pages, page, HKV, D, dtype=torch.bfloat16, device=dev)
    v_cache = torch.randn(num_pages, page, HKV, D, dtype=torch.bfloat16, device=dev)
    q = torch.randn(b * t, HQ, D, dtype=torch.bfloat16, device=dev)
    kv_indices = torch.randperm(num_pages, generator=gen).to(torch.int32)
    kv_indptr = torch.arange(b + 1, dtype=torch.int32) * pages_per_req
    last_page_len = torch.full((b,), kv_len - (pages_per_req - 1) * page, dtype=torch.int32)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32) * t
    anc = torch.stack([tree_ancestors(t, rng) for _ in range(b)]).to(dev)  # [B, T, T]
    mask = torch.ones(b, t, kv_len, dtype=torch.bool, device=dev)
    mask[:, :, l:] = anc
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, kv_indices=kv_indices.to(dev),
                kv_indptr=kv_indptr, last_page_len=last_page_len, qo_indptr=qo_indptr,
                mask=mask, anc=anc, pages_per_req=pages_per_req)


class Runner:
    """One wrapper, its float workspace grown on demand (FA2 split-KV partials need
    num_qo_heads * padded_batch * cta_tile_q * head_dim * 4 bytes, which can pass 256 MB)."""

    def __init__(self, flashinfer, workspace_mb):
        self.fi = flashinfer
        self.ws = torch.empty(workspace_mb << 20, dtype=torch.uint8, device="cuda")
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.ws, "NHD", backend="fa2")

    def plan_args(self, p, page):
        return ((p["qo_indptr"], p["kv_indptr"], p["kv_indices"], p["last_page_len"], HQ, HKV, D,
                 page),
                dict(custom_mask=p["mask"].view(-1), q_data_type=torch.bfloat16,
                     kv_data_type=torch.bfloat16))

    def ensure_workspace(self, p, page):
        """Use the wrapper's workspace_size() (present in recent releases) to grow the buffers."""
        if not hasattr(self.wrapper, "workspace_size"):
            return None
        args, kw = self.plan_args(p, page)
        try:
            fl, it = self.wrapper.workspace_size(*args, **kw)
        except NotImplementedError:
            return None
        need_f, need_i = int(fl) + (1 << 20), int(it) + (1 << 20)
        cur_i = self.wrapper._int_workspace_buffer.numel()
        if need_f > self.ws.numel() or need_i > cur_i:
            new_f = torch.empty(max(need_f, self.ws.numel()), dtype=torch.uint8, device="cuda")
            new_i = torch.empty(max(need_i, cur_i), dtype=torch.uint8, device="cuda")
            self.wrapper.reset_workspace_buffer(new_f, new_i)
            self.ws = new_f
            torch.cuda.empty_cache()
        return int(fl), int(it)

    def plan(self, p, page):
        args, kw = self.plan_args(p, page)
        self.wrapper.plan(*args, **kw)

    def run(self, p, out):
        return self.wrapper.run(p["q"], (p["k_cache"], p["v_cache"]), out=out)


def reference(p, b, l, t, page):
    """Torch SDPA (fp32) with a dense boolean mask on K/V gathered from the pages."""
    kv_len = l + t
    idx = p["kv_indices"].long().view(b, p["pages_per_req"])
    k = p["k_cache"][idx].reshape(b, -1, HKV, D)[:, :kv_len].permute(0, 2, 1, 3).float()
    v = p["v_cache"][idx].reshape(b, -1, HKV, D)[:, :kv_len].permute(0, 2, 1, 3).float()
    q = p["q"].view(b, t, HQ, D).permute(0, 2, 1, 3).float()
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=p["mask"].unsqueeze(1), enable_gqa=True)
    return o.permute(0, 2, 1, 3).reshape(b * t, HQ, D)


def check_point(runner, b, l, t, page, rng, gen):
    p = make_point(b, l, t, page, rng, gen)
    runner.ensure_workspace(p, page)
    runner.plan(p, page)
    out = torch.empty_like(p["q"])
    runner.run(p, out)
    torch.cuda.synchronize()
    err = (out.float() - reference(p, b, l, t, page)).abs().max().item()
    return err


def bench_point(runner, b, l, t, page, rng, gen, plan_reps):
    row = {"batch": b, "context": l, "tree": t}
    p = make_point(b, l, t, page, rng, gen)
    ws = runner.ensure_workspace(p, page)
    if ws is not None:
        row["float_workspace_bytes"], row["int_workspace_bytes"] = ws
    plan_times = []
    for _ in range(max(1, plan_reps)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.plan(p, page)
        torch.cuda.synchronize()
        plan_times.append((time.perf_counter() - t0) * 1e6)
    row["plan_us"] = sorted(plan_times)[len(plan_times) // 2]
    info = getattr(runner.wrapper, "_plan_info", None)
    if isinstance(info, (list, tuple)) and len(info) == 15:  # PrefillPlanInfo::ToVector
        row["padded_batch_size"], row["cta_tile_q"], row["split_kv"] = (
            int(info[0]), int(info[3]), bool(info[14]))
    out = torch.empty_like(p["q"])
    fn = lambda: runner.run(p, out)
    fn()
    row["flashinfer_us"] = do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
    return row


def parse_points(s):
    return [tuple(map(int, x.lower().split("x"))) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,8,16,32,64")
    ap.add_argument("--context", default="1024,2048,8192,32768")
    ap.add_argument("--tree", default="16,32,64,128")
    ap.add_argument("--points", default="", help="BxLxT list, e.g. 8x2048x64,32x4096x32; "
                    "replaces the batch x context x tree grid")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting points after this")
    ap.add_argument("--max-gb", type=float, default=40, help="skip points above this estimate")
    ap.add_argument("--workspace-mb", type=int, default=512)
    ap.add_argument("--plan-reps", type=int, default=5)
    ap.add_argument("--check-points", default="2x1024x16,3x200x61,4x2048x128")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--jit-only", action="store_true", help="JIT-compile (and check), then exit")
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    page = a.page_size
    t_start = time.time()
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    import flashinfer

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "flashinfer": flashinfer.__version__, "cuda_home": os.environ.get("CUDA_HOME", ""),
            "page_size": page}
    print(f"# {meta['device']}, torch {meta['torch']}, flashinfer {meta['flashinfer']}", flush=True)
    runner = Runner(flashinfer, a.workspace_mb)

    # JIT warm-up: the first plan() builds (or loads from the cache) segment_packbits and the
    # FA2 batch-prefill module; --budget-s counts this time too.
    t0 = time.time()
    p = make_point(1, 64, 16, page, rng, gen)
    runner.plan(p, page)
    runner.run(p, torch.empty_like(p["q"]))
    torch.cuda.synchronize()
    meta["jit_warmup_s"] = time.time() - t0
    print(f"# JIT warm-up (compile or cache load): {meta['jit_warmup_s']:.1f} s", flush=True)
    del p

    if not a.no_check:
        errs = {}
        for b, l, t in parse_points(a.check_points):
            errs[f"{b}x{l}x{t}"] = err = check_point(runner, b, l, t, page, rng, gen)
            print(f"# check B={b} L={l} T={t}: max |flashinfer - sdpa(fp32)| = {err:.3e}", flush=True)
        meta["check_max_abs_err"] = errs
        torch.cuda.empty_cache()
        bad = {k: v for k, v in errs.items() if not (v <= a.tol)}
        if bad:
            print(f"CHECK FAILED: max abs error above {a.tol}: {bad}", file=sys.stderr, flush=True)
            if a.out:
                with open(a.out, "w") as f:
                    json.dump({"meta": meta, "results": []}, f, indent=1)
            return 1
    if a.jit_only:
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"meta": meta, "results": []}, f, indent=1)
        return 0

    if a.points:
        grid = parse_points(a.points)
    else:
        grid = [(b, l, t) for b in map(int, a.batch.split(",")) for l in map(int, a.context.split(","))
                for t in map(int, a.tree.split(","))]
        grid += [(32, 4096, 32)]  # one of the quoted SDPA points, as torch_attention_bench
    results = []
    print("| B | L | T | flashinfer_us | plan_us |\n|---|---|---|---|---|", flush=True)
    for b, l, t in grid:
        row = {"batch": b, "context": l, "tree": t}
        gb = est_bytes(b, l, t, page) / 1e9
        if gb > a.max_gb:
            row["skipped"] = f"estimated {gb:.1f} GB > --max-gb {a.max_gb}"
        elif a.budget_s and time.time() - t_start > a.budget_s:
            row["skipped"] = f"--budget-s {a.budget_s} spent"
        else:
            try:
                row = bench_point(runner, b, l, t, page, rng, gen, a.plan_reps)
            except Exception as e:  # noqa: BLE001  (OOM, plan/run errors): record and go on
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        results.append(row)
        fi = f"{row['flashinfer_us']:.1f}" if "flashinfer_us" in row else (
            row.get("error") or row.get("skipped", "-"))
        pl = f"{row['plan_us']:.0f}" if "plan_us" in row else "-"
        print(f"| {b} | {l} | {t} | {fi} | {pl} |", flush=True)
        torch.cuda.empty_cache()
    meta["total_s"] = time.time() - t_start
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
