#!/usr/bin/env python3
"""Held-out acceptance proxies of saved speculation heads on self-distillation data files, and a
format check of head directories against reference ones.

Evaluation: each head directory (Medusa: medusa_lm_head.safetensors; EAGLE-1/2 and EAGLE-3:
model.safetensors) is loaded back into the trainers' modules (strict names and shapes) and
measured with spec_train_common.evaluate on the held-out sequences of each data file: top-1
accuracy by draft step and the greedy-chain mean accepted length (docs/heads.md, Results). A
data file whose groups are MT-bench questions (`mt<id>`) is also reported on the 16 questions
with id % 5 == 0 alone (`<name>_q5`), the ones the first SmolLM2 heads did not train on.

Format check (--reference KIND=DIR, KIND one of medusa, eagle, eagle3): the same file names,
tensor names and config keys as DIR, and unless --names-only (a reference of another base) the
same tensor dtypes and shapes and the same values of the structural config keys.

  python3 scripts/eval_heads.py --base /tmp/base_hf --heads new_eagle=/tmp/heads/eagle \\
      old_eagle=tests/data/heads/smollm2/eagle --data outside=/tmp/outside.npz --out eval.json
  python3 scripts/eval_heads.py --check-only --heads eagle=/tmp/heads/eagle \\
      --reference eagle=tests/data/heads/smollm2/eagle
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_train_common as C  # noqa: E402

STRUCTURAL = {"medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size",
              "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "num_hidden_layers", "rms_norm_eps", "rope_theta", "bias", "draft_vocab_size",
              "eagle3_layers", "architectures", "torch_dtype"}


def head_kind(head_dir):
    if os.path.exists(os.path.join(head_dir, "medusa_lm_head.safetensors")):
        return "medusa"
    from safetensors import safe_open
    with safe_open(os.path.join(head_dir, "model.safetensors"), "pt") as f:
        return "eagle3" if "d2t" in f.keys() else "eagle"


def tensor_table(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape()))
                for k in f.keys()}


def compare_format(head_dir, ref_dir, names_only=False):
    """Differences (strings) between a head directory and a reference one."""
    diffs = []
    files, ref_files = sorted(os.listdir(head_dir)), sorted(os.listdir(ref_dir))
    if files != ref_files:
        diffs.append(f"files {files} vs {ref_files}")
    st = [f for f in ref_files if f.endswith(".safetensors")]
    for name in st:
        if name not in files:
            continue
        a, b = tensor_table(os.path.join(head_dir, name)), tensor_table(os.path.join(ref_dir, name))
        if sorted(a) != sorted(b):
            diffs.append(f"{name}: tensors {sorted(set(a) ^ set(b))} differ")
        for k in sorted(set(a) & set(b)):
            if not names_only and a[k] != b[k]:
                diffs.append(f"{name}: {k} {a[k]} vs {b[k]}")
    ca = json.load(open(os.path.join(head_dir, "config.json")))
    cb = json.load(open(os.path.join(ref_dir, "config.json")))
    if sorted(ca) != sorted(cb):
        diffs.append(f"config keys differ: {sorted(set(ca) ^ set(cb))}")
    if not names_only:
        for k in sorted(STRUCTURAL & set(ca) & set(cb)):
            if ca[k] != cb[k]:
                diffs.append(f"config {k}: {ca[k]} vs {cb[k]}")
    return diffs


def subset(data, keep):
    """The same data with only the sequences where keep(group) held out."""
    d = dict(data)
    d["heldout"] = [h and keep(g) for h, g in zip(data["heldout"], data["groups"])]
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=None, help="HF directory or GGUF (not with --check-only)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heads", nargs="+", required=True, help="NAME=DIR ...")
    ap.add_argument("--data", nargs="*", default=[], help="NAME=FILE (.pt or .npz) ...")
    ap.add_argument("--reference", nargs="*", default=[], help="KIND=DIR ...")
    ap.add_argument("--names-only", action="store_true", help="format check without shapes")
    ap.add_argument("--check-only", action="store_true", help="format check, no evaluation")
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--out", default=None, help="results as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    heads = dict(x.split("=", 1) for x in args.heads)
    refs = dict(x.split("=", 1) for x in args.reference)

    failed = False
    for name, d in heads.items():
        kind = head_kind(d)
        if kind in refs:
            diffs = compare_format(d, refs[kind], args.names_only)
            same = ("same files, tensor names and config keys" if args.names_only else
                    "same files, tensor names, dtypes, shapes and config keys")
            C.log(f"[format] {name} ({kind}) vs {refs[kind]}: "
                  + (same if not diffs else "; ".join(diffs)))
            failed |= bool(diffs)
    if args.check_only:
        sys.exit(1 if failed else 0)

    from train_eagle import eagle_predict, load_eagle
    from train_medusa import load_medusa, medusa_predict
    base = C.load_base(args.base, args.device)
    amp = base.device.type == "cuda"
    W = base.lm_head_weight()
    datasets = {}
    for x in args.data:
        name, path = x.split("=", 1)
        data = C.load_data(path)
        datasets[name] = data
        if all(g.startswith("mt") for g in data["groups"]):
            datasets[f"{name}_q5"] = subset(data, lambda g: int(g[2:]) % 5 == 0)
    results = []
    for name, d in heads.items():
        if head_kind(d) == "medusa":
            model, cfg = load_medusa(d, base)
            steps, capture = cfg["medusa_num_heads"], []
            predict = medusa_predict(model, W, steps, amp)
        else:
            model, cfg, capture = load_eagle(d, base)
            steps = 5
            predict = eagle_predict(model, base, W, steps, amp)
        for dname, data in datasets.items():
            ev = C.evaluate(base, data, predict, steps, capture, batch_tokens=args.batch_tokens)
            C.print_eval(f"{name} on {dname}", ev)
            results.append({"head": name, "dir": d, "data": dname, **ev})
        del model
    print("\n| head | data | top-1 acc by step | greedy chain accepted length | positions |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['head']} | {r['data']} | {' '.join(f'{a:.3f}' for a in r['acc'])} | "
              f"{r['chain_accept_len']:.2f} | {r['positions']} |")
    if args.out:
        C.write_json({"results": results,
                      "data": {k: v["meta"] for k, v in datasets.items()}}, args.out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
