#!/usr/bin/env python3
"""Converts a SafeAILab EAGLE / EAGLE-3 draft checkpoint (pytorch_model.bin + config.json) to
the model.safetensors directory engine/draft/eagle_checkpoint.h loads. (Medusa heads:
scripts/convert_medusa_pt.py.)

  python3 scripts/convert_eagle_bin.py IN_DIR OUT_DIR

Tensors keep their names and dtypes (F32/F16/BF16 are read as fp32 at load; d2t stays int64,
t2d bool); storage shared between tensors is cloned, as safetensors requires.
"""
import argparse
import os
import shutil
import sys

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src_dir", help="directory with pytorch_model.bin and config.json")
    ap.add_argument("out_dir")
    args = ap.parse_args()
    path = os.path.join(args.src_dir, "pytorch_model.bin")
    if not os.path.exists(path):
        sys.exit(f"{path} not found")
    sd = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(sd, dict):
        sys.exit(f"{path}: expected a state dict, found {type(sd).__name__}")
    sd = {k: v.detach().clone().contiguous() for k, v in sd.items() if torch.is_tensor(v)}
    os.makedirs(args.out_dir, exist_ok=True)
    save_file(sd, os.path.join(args.out_dir, "model.safetensors"))
    src_cfg = os.path.join(args.src_dir, "config.json")
    dst_cfg = os.path.join(args.out_dir, "config.json")
    if not os.path.exists(src_cfg):
        sys.exit(f"{src_cfg} not found (the draft's one-layer Llama config)")
    if os.path.abspath(src_cfg) != os.path.abspath(dst_cfg):
        shutil.copyfile(src_cfg, dst_cfg)
    print(f"{path}: {len(sd)} tensors -> {args.out_dir}/model.safetensors")


if __name__ == "__main__":
    main()
