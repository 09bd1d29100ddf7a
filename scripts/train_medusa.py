#!/usr/bin/env python3
"""Train Medusa heads (FasterDecoding format) by self-distillation on the base model's own
generations, and save exactly what engine/spec's Medusa loader reads:

  OUT/medusa_lm_head.safetensors
      {i}.{l}.linear.weight [h,h], {i}.{l}.linear.bias [h]   l < medusa_num_layers (ResBlocks)
      {i}.{L}.weight [V,h]                                   head i's own LM head (no bias);
                                                             absent with --share-lm-head
  OUT/config.json   {medusa_num_heads, medusa_num_layers, hidden_size, vocab_size,
                     base_model_name_or_path}
  OUT/train_metrics.json

Head i applied to the base's final-norm hidden state at position t predicts the token at
t+i+2 (the base LM head predicts t+1). ResBlock: x + SiLU(W x + b), W zero-initialised; each
own LM head starts as a copy of the base LM head (as Medusa does). Loss: soft cross-entropy
against the base's own distribution at t+i+1 (self-distillation, Medusa-2 style), head i
weighted 0.8^i.

  python3 scripts/train_medusa.py --base ../shared/models/stories260K/stories260K.bin \
      --data /tmp/stories_data.pt --out tests/data/heads/stories260K/medusa
"""
import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_train_common as C  # noqa: E402


class ResBlock(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.linear = nn.Linear(h, h)
        nn.init.zeros_(self.linear.weight)  # Medusa: start as the identity
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, h, vocab, n_heads, n_layers, share_lm_head, base_lm_head):
        super().__init__()
        self.n_heads, self.n_layers, self.share = n_heads, n_layers, share_lm_head
        heads = []
        for _ in range(n_heads):
            mods = [ResBlock(h) for _ in range(n_layers)]
            if not share_lm_head:
                lm = nn.Linear(h, vocab, bias=False)
                with torch.no_grad():
                    lm.weight.copy_(base_lm_head)
                mods.append(lm)
            heads.append(nn.Sequential(*mods))
        self.heads = nn.ModuleList(heads)

    def logits(self, i, hidden, base_lm_head):
        x = self.heads[i](hidden)
        return F.linear(x, base_lm_head) if self.share else x

    def export(self):
        # nn.ModuleList of nn.Sequential names: heads.{i}.{l}.linear.*, heads.{i}.{L}.weight
        return {k[len("heads."):]: v for k, v in self.state_dict().items()}


def medusa_predict(model, W, n_heads, amp):
    """C.evaluate's predict: head i's top-1 at every position."""
    def predict(outs, ids):
        h = outs["hidden"]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            return [model.logits(i, h, W).argmax(-1) for i in range(n_heads)]
    return predict


def load_medusa(head_dir, base):
    """A saved head directory back into MedusaHeads (strict: every tensor name and shape must be
    what the trainer writes). Returns (model, config)."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(head_dir, "config.json")))
    sd = load_file(os.path.join(head_dir, "medusa_lm_head.safetensors"))
    share = f"0.{cfg['medusa_num_layers']}.weight" not in sd
    model = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], cfg["medusa_num_heads"],
                        cfg["medusa_num_layers"], share, base.lm_head_weight().detach().float())
    model.load_state_dict({"heads." + k: v.float() for k, v in sd.items()}, strict=True)
    return model.to(base.device).eval(), cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_base_args(ap)
    C.add_data_args(ap)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--share-lm-head", action="store_true",
                    help="Medusa-2 style: no own LM heads, the base LM head is used")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--time-budget", type=float, default=None,
                    help="stop training after this many seconds")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--max-len", type=int, default=None, help="truncate sequences")
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of head i: decay^i")
    ap.add_argument("--save-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()
    C.setup(args)

    base = C.load_base(args.base, args.device, name=args.base_name)
    data = C.load_or_make_data(args, base)
    dev = base.device
    W = base.lm_head_weight()
    model = MedusaHeads(base.hidden, base.vocab, args.heads, args.layers, args.share_lm_head,
                        W.detach().float()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    sched = C.LRSchedule(opt, args.lr, args.warmup, args.steps, args.time_budget)
    amp = dev.type == "cuda"
    train_idx = C.split_indices(data, False)
    rng = random.Random(args.seed)
    C.log(f"medusa: {args.heads} heads x {args.layers} layers, "
          f"{'shared' if args.share_lm_head else 'own'} LM head, "
          f"{sum(p.numel() for p in model.parameters())} params; "
          f"{len(train_idx)} train sequences")

    predict = medusa_predict(model, W, args.heads, amp)

    model.eval()
    ev0 = C.evaluate(base, data, predict, args.heads, batch_tokens=args.batch_tokens,
                     max_len=args.max_len)
    C.print_eval("medusa init", ev0)
    model.train()

    t0 = time.time()
    sched.t0 = t0
    step, hist, history = 0, [], []
    while step < args.steps:
        for b in C.make_batches(data, train_idx, args.batch_tokens, True, rng, args.max_len):
            if step >= args.steps or (args.time_budget and time.time() - t0 > args.time_budget):
                break
            ids, lens, plens = C.collate(data, b, dev, args.max_len)
            outs = C.base_outputs(base, ids)
            T = ids.shape[1]
            sched.step(step)
            loss, parts = 0.0, []
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                for i in range(args.heads):
                    m = C.valid_mask(lens, plens, T, i + 1)
                    if not m.any():
                        parts.append(0.0)
                        continue
                    target = C.shift_left(outs["logits"], i + 1)[m]
                    p = F.softmax(target.float(), -1)
                    logp = F.log_softmax(model.logits(i, outs["hidden"][m], W).float(), -1)
                    li = -(p * logp).sum(-1).mean()
                    loss = loss + (args.decay ** i) * li
                    parts.append(float(li.detach()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            hist.append(parts)
            step += 1
            if step % args.log_every == 0 or step == 1:
                avg = [sum(x[i] for x in hist) / len(hist) for i in range(args.heads)]
                history.append({"step": step, "loss_by_head": avg})
                C.log(f"step {step} ({time.time() - t0:.0f}s) loss by head: "
                      + " ".join(f"{a:.3f}" for a in avg))
                hist = []
        if args.time_budget and time.time() - t0 > args.time_budget:
            break
    train_s = time.time() - t0
    model.eval()
    ev = C.evaluate(base, data, predict, args.heads, batch_tokens=args.batch_tokens,
                    max_len=args.max_len)
    C.print_eval("medusa trained", ev)

    os.makedirs(args.out, exist_ok=True)
    size = C.save_safetensors(model.export(), os.path.join(args.out,
                                                           "medusa_lm_head.safetensors"),
                              C.parse_dtype(args.save_dtype))
    C.write_json({"medusa_num_heads": args.heads, "medusa_num_layers": args.layers,
                  "hidden_size": base.hidden, "vocab_size": base.vocab,
                  "base_model_name_or_path": base.name}, os.path.join(args.out, "config.json"))
    C.write_json({"kind": "medusa", "steps": step, "train_seconds": round(train_s, 1),
                  "share_lm_head": args.share_lm_head, "args": vars(args),
                  "data": data["meta"], "loss_history": history,
                  "heldout_init": ev0, "heldout": ev},
                 os.path.join(args.out, "train_metrics.json"))
    C.log(f"saved {args.out} (medusa_lm_head.safetensors {size} bytes, {args.save_dtype})")


if __name__ == "__main__":
    main()
