#!/usr/bin/env python3
"""Convert a FasterDecoding Medusa head checkpoint (`medusa_lm_head.pt`, a PyTorch state dict)
to the safetensors directory that engine/spec's Medusa loader reads:

  OUT/medusa_lm_head.safetensors   {i}.{l}.linear.weight [h,h], {i}.{l}.linear.bias [h]
                                   (l < medusa_num_layers), {i}.{L}.weight [V,h] (optional:
                                   absent = the base LM head is shared, Medusa-2 style)
  OUT/config.json                  {medusa_num_heads, medusa_num_layers, hidden_size,
                                    vocab_size, base_model_name_or_path}

Key prefixes `module.`, `medusa_head.` and `base_model.medusa_head.` are stripped; other
tensors (a full Medusa-2 model's base weights) are ignored. Head and layer counts come from the
tensor names, not from the published config (often wrong); the config beside the .pt, if any,
supplies base_model_name_or_path. Tensors shared between layers (the official
`[ResBlock(h)] * medusa_num_layers` builds one module repeated) are written once per name.

  python3 scripts/convert_medusa_pt.py path/to/medusa_lm_head.pt --out path/to/medusa_dir \
      [--config path/to/config.json] [--dtype keep|fp32|bf16|fp16]
"""
import argparse
import json
import os
import re
import sys

import torch
from safetensors.torch import save_file

KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")
PREFIXES = ("module.", "base_model.medusa_head.", "medusa_head.")


def fail(msg):
    sys.exit(f"convert_medusa_pt: {msg}")


def load_state(path):
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - old pickles need the full unpickler
        print(f"note: weights_only load failed ({e.__class__.__name__}); loading the full pickle",
              file=sys.stderr)
        sd = torch.load(path, map_location="cpu", weights_only=False)
    if hasattr(sd, "state_dict"):
        sd = sd.state_dict()
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        fail(f"{path}: expected a state dict, found {type(sd).__name__}")
    return sd


def convert(sd, src):
    out, skipped = {}, []
    for k, v in sd.items():
        name = k
        changed = True
        while changed:
            changed = False
            for p in PREFIXES:
                if name.startswith(p):
                    name, changed = name[len(p):], True
        if not torch.is_tensor(v) or not KEY.match(name):
            skipped.append(k)
            continue
        out[name] = v
    if not out:
        fail(f"{src}: no Medusa head tensors ({{i}}.{{l}}.linear.weight ...) among "
             f"{list(sd)[:8]}")
    heads = sorted({int(KEY.match(k).group(1)) for k in out})
    if heads != list(range(len(heads))):
        fail(f"{src}: head indices {heads} are not 0..{len(heads) - 1}")
    n_layers, hidden, vocab, own = None, None, None, None
    for i in heads:
        lin = sorted({int(KEY.match(k).group(2)) for k in out
                      if k.startswith(f"{i}.") and "linear" in k})
        if lin != list(range(len(lin))):
            fail(f"{src}: head {i} ResBlock indices {lin} are not contiguous from 0")
        if n_layers is None:
            n_layers = len(lin)
        elif n_layers != len(lin):
            fail(f"{src}: head {i} has {len(lin)} ResBlocks, head 0 has {n_layers}")
        for l in lin:
            w, b = out.get(f"{i}.{l}.linear.weight"), out.get(f"{i}.{l}.linear.bias")
            if w is None or b is None:
                fail(f"{src}: head {i} layer {l}: linear.weight and linear.bias both needed")
            if w.dim() != 2 or w.shape[0] != w.shape[1] or b.shape != (w.shape[0],):
                fail(f"{src}: {i}.{l}.linear: weight {list(w.shape)}, bias {list(b.shape)}; "
                     "expected [h,h] and [h]")
            if hidden is None:
                hidden = w.shape[0]
            elif hidden != w.shape[0]:
                fail(f"{src}: {i}.{l}.linear.weight is {list(w.shape)}, expected [{hidden},"
                     f"{hidden}]")
        lm = out.get(f"{i}.{n_layers}.weight")
        extra = [k for k in out if k.startswith(f"{i}.") and k.endswith(".weight")
                 and "linear" not in k and k != f"{i}.{n_layers}.weight"]
        if extra:
            fail(f"{src}: unexpected tensors {extra} (LM head must be {i}.{n_layers}.weight)")
        if own is None:
            own = lm is not None
        elif own != (lm is not None):
            fail(f"{src}: some heads have their own LM head and some do not")
        if lm is not None:
            if hidden is not None and (lm.dim() != 2 or lm.shape[1] != hidden):
                fail(f"{src}: {i}.{n_layers}.weight is {list(lm.shape)}, expected [V,{hidden}]")
            if vocab is None:
                vocab = lm.shape[0]
            elif vocab != lm.shape[0]:
                fail(f"{src}: LM heads disagree on vocab ({vocab} vs {lm.shape[0]})")
            if hidden is None:
                hidden = lm.shape[1]
    return out, len(heads), n_layers, hidden, vocab, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pt", help="medusa_lm_head.pt (or any state dict holding the heads)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--config", default=None,
                    help="the published config.json (default: config.json beside the .pt)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="needed when the heads share the base LM head and no config says it")
    ap.add_argument("--dtype", choices=["keep", "fp32", "bf16", "fp16"], default="keep")
    args = ap.parse_args()

    sd = load_state(args.pt)
    tensors, n_heads, n_layers, hidden, vocab, skipped = convert(sd, args.pt)
    cfg_path = args.config or os.path.join(os.path.dirname(os.path.abspath(args.pt)),
                                           "config.json")
    src_cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    vocab = vocab or args.vocab_size or src_cfg.get("vocab_size")
    if vocab is None:
        fail("the heads share the base LM head: pass --vocab-size")
    for k in ("medusa_num_heads", "medusa_num_layers"):
        want = n_heads if k == "medusa_num_heads" else n_layers
        if k in src_cfg and src_cfg[k] != want:
            print(f"note: {cfg_path} says {k}={src_cfg[k]}; the tensors hold {want} (used)",
                  file=sys.stderr)
    dtype = {"keep": None, "fp32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16}[args.dtype]
    out = {}
    for k, v in tensors.items():
        v = v.detach()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        out[k] = v.contiguous().clone()  # clone: shared storage is not allowed in safetensors
    os.makedirs(args.out, exist_ok=True)
    save_file(out, os.path.join(args.out, "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    cfg = {"medusa_num_heads": n_heads, "medusa_num_layers": n_layers, "hidden_size": hidden,
           "vocab_size": vocab,
           "base_model_name_or_path": src_cfg.get("base_model_name_or_path", "")}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}: {n_heads} heads x {n_layers} ResBlocks, hidden {hidden}, vocab "
          f"{vocab}, {'own' if any(k.endswith(f'.{n_layers}.weight') for k in out) else 'shared'}"
          f" LM head; {len(out)} tensors" + (f"; ignored {len(skipped)} others" if skipped else ""))


if __name__ == "__main__":
    main()
