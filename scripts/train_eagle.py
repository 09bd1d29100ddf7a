#!/usr/bin/env python3
"""Train an EAGLE draft head (SafeAILab format) by self-distillation on the base model's own
generations, and save exactly what engine/spec's EAGLE loaders read.

--version 1 (or 2: the same weights; EAGLE-2 differs only in its dynamic tree at inference):
  OUT/config.json        one-layer LlamaConfig with the base's sizes plus "bias"
  OUT/model.safetensors  fc.weight [h,2h] (+ fc.bias if bias),
                         layers.0.self_attn.{q,k,v,o}_proj.weight,
                         layers.0.post_attention_layernorm.weight,
                         layers.0.mlp.{gate,up,down}_proj.weight
                         (no input_layernorm; embeddings and LM head are the base's, not saved)
  Forward at position t: x = fc(concat(embed(token_{t+1}), f_t)), f_t = the base's final-norm
  hidden state at t; x += attn(x) (causal, RoPE); x += mlp(post_attention_layernorm(x)); x is the
  predicted f_{t+1} (no final norm) and base_lm_head(x) predicts token_{t+2}. Drafting further
  feeds the predicted feature back in place of f.
  Loss (EAGLE): smooth-L1(x, f_{t+1}) + 0.1 * CE(softmax(base logits at t+1), lm_head(x)), with
  uniform noise on the input features (EAGLE's data augmentation). --ttt-steps N > 1 (default 1,
  the official EAGLE-1 recipe) also unrolls the draft on its own predicted features as
  EAGLE-3's training-time test below, the same loss at every step, step j weighted 0.8^j.

--version 3:
  OUT/model.safetensors  fc.weight [h,3h] (no bias) over concat(g_low, g_mid, g_high), g_k = the
                         base's residual stream at the input of layer k (official choice
                         2, L//2, L-3; for L < 7 the project rule of eagle3_capture_layers in
                         engine/draft/eagle_checkpoint.h; written to config.json as
                         "eagle3_layers" and eagle_config.eagle_aux_hidden_state_layer_ids);
                         midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight,
                         midlayer.self_attn.{q,k,v}_proj.weight [.,2h],
                         midlayer.self_attn.o_proj.weight,
                         midlayer.mlp.{gate,up,down}_proj.weight, norm.weight,
                         lm_head.weight [draft_V,h], d2t [draft_V] int64, t2d [V] bool
  Forward (as SafeAILab/EAGLE eagle/model/cnets.py): h = fc(concat(g)) at the first draft step
  (the draft's own output h afterwards); x = concat(input_layernorm(embed(token_{t+1})),
  hidden_norm(h)); h' = h + attn(x); out = h' + mlp(post_attention_layernorm(h')); draft logits =
  lm_head(norm(out)); target id = draft id + d2t[draft id]; out is fed back as h.
  Loss (EAGLE-3, eagle/traineagle3): soft CE against the base's distribution at t+j+1 restricted
  to the draft vocabulary, on positions whose base top-1 is in it; training-time test: the draft
  is unrolled --ttt-steps steps on its own hidden states (step j's query at t attends to step 0's
  keys at <= t and to its own chain's keys at t from steps 1..j, RoPE position t+j), step j
  weighted 0.8^j. The draft vocabulary is the draft_V most frequent tokens of the training data.
  (Departure from the official code: lm_head starts from the base LM head's rows of the draft
  vocabulary and norm from the base's final norm, instead of random; --random-init for the
  official behaviour.)

  python3 scripts/train_eagle.py --base ../shared/models/stories260K/stories260K.bin \
      --data /tmp/stories_data.pt --out tests/data/heads/stories260K/eagle
  python3 scripts/train_eagle.py --version 3 ... --out tests/data/heads/stories260K/eagle3
"""
import argparse
import json
import math
import os
import random
import sys
import time
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_train_common as C  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, in_dim, h, nh, nkv, hd, theta):
        super().__init__()
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, theta
        self.q_proj = nn.Linear(in_dim, nh * hd, bias=False)
        self.k_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.v_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)

    def rope(self, T, offset, device):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, device=device).float() / self.hd))
        pos = torch.arange(T, device=device).float() + offset
        f = pos[:, None] * inv[None, :]
        emb = torch.cat((f, f), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, x, cache):
        """cache: list of (K, V) of earlier unroll steps (step 0 = the causal pass)."""
        B, T, _ = x.shape
        j = len(cache)
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = self.rope(T, j, x.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if j == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            K0, V0 = cache[0]
            scale = 1.0 / math.sqrt(self.hd)
            s0 = torch.matmul(q, K0.transpose(-1, -2)) * scale
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            s0 = s0.masked_fill(~causal, float("-inf"))
            chain = [c for c in cache[1:]] + [(k, v)]
            extra = [((q * Ki).sum(-1, keepdim=True) * scale) for Ki, _ in chain]
            a = torch.softmax(torch.cat([s0] + extra, -1).float(), -1).to(q.dtype)
            o = torch.matmul(a[..., :T], V0)
            for i, (_, Vi) in enumerate(chain):
                o = o + a[..., T + i:T + i + 1] * Vi
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o), cache + [(k, v)]


class MLP(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """EAGLE-1/2: a Llama decoder layer without input_layernorm (v3=False).
    EAGLE-3: the 'midlayer' (hidden_norm + input_layernorm, q/k/v over 2h)."""

    def __init__(self, b, v3):
        super().__init__()
        self.v3 = v3
        h = b.hidden
        if v3:
            self.hidden_norm = RMSNorm(h, b.eps)
            self.input_layernorm = RMSNorm(h, b.eps)
        self.self_attn = Attention(2 * h if v3 else h, h, b.heads, b.kv_heads, b.head_dim,
                                   b.rope_theta)
        self.post_attention_layernorm = RMSNorm(h, b.eps)
        self.mlp = MLP(h, b.inter)

    def forward(self, x, cache, emb=None):
        residual = x
        if self.v3:
            x = torch.cat((self.input_layernorm(emb), self.hidden_norm(x)), dim=-1)
        a, cache = self.self_attn(x, cache)
        x = residual + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, cache


class EagleDraft(nn.Module):
    def __init__(self, b, version, bias, used_tokens=None, init_from_base=True):
        super().__init__()
        self.v3 = version == 3
        h = b.hidden
        if self.v3:
            self.fc = nn.Linear(3 * h, h, bias=False)
            self.midlayer = DraftLayer(b, True)
            self.norm = RMSNorm(h, b.eps)
            dv = len(used_tokens)
            self.lm_head = nn.Linear(h, dv, bias=False)
            used = torch.tensor(sorted(used_tokens), dtype=torch.long)
            self.register_buffer("d2t", used - torch.arange(dv))
            t2d = torch.zeros(b.vocab, dtype=torch.bool)
            t2d[used] = True
            self.register_buffer("t2d", t2d)
            if init_from_base:
                with torch.no_grad():
                    self.lm_head.weight.copy_(b.lm_head_weight().detach().float().cpu()[used])
                    self.norm.weight.copy_(b.model.model.norm.weight.detach().float().cpu())
        else:
            self.fc = nn.Linear(2 * h, h, bias=bias)
            self.layers = nn.ModuleList([DraftLayer(b, False)])

    def step(self, emb, hid, cache):
        """One draft step over all positions: returns (out hidden, cache)."""
        if self.v3:
            if len(cache) == 0:
                hid = self.fc(hid)
            return self.midlayer(hid, cache, emb)
        x = self.fc(torch.cat((emb, hid), dim=-1))
        return self.layers[0](x, cache)

    def logits(self, out, base_w):
        if self.v3:
            return self.lm_head(self.norm(out))
        return F.linear(out, base_w)

    def to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids] if self.v3 else draft_ids


def eagle3_layers(L, override=None):
    """Residual-stream capture points (index k = the input of layer k; k == L = after the last
    layer, before the final norm). Official: 2, L//2, L-3; those collide for L < 7, where this
    project uses the rule of engine/draft/eagle_checkpoint.h (eagle3_capture_layers) and
    scripts/spec_heads_reference.py."""
    if override:
        return [int(x) for x in override.split(",")]
    from spec_heads_reference import eagle3_capture_layers  # one copy of the rule
    return eagle3_capture_layers(L)


def eagle_predict(model, base, W, steps, amp):
    """C.evaluate's predict: the draft unrolled `steps` steps on its own features, teacher tokens
    as inputs; step j's top-1 (target-vocabulary ids) at every position."""
    def predict(outs, ids):
        emb = base.embed(ids)
        hid = torch.cat(outs["captured"], -1) if model.v3 else outs["hidden"]
        cache, preds = [], []
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            for j in range(steps):
                out, cache = model.step(C.shift_left(emb, j + 1), hid, cache)
                preds.append(model.to_target(model.logits(out, W).argmax(-1)))
                hid = out
        return preds
    return predict


def load_eagle(head_dir, base):
    """A saved head directory back into EagleDraft (strict names and shapes). Returns (model,
    config, capture layers: [] for EAGLE-1/2)."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(head_dir, "config.json")))
    sd = load_file(os.path.join(head_dir, "model.safetensors"))
    v3 = "d2t" in sd
    used = (sd["d2t"] + torch.arange(sd["d2t"].numel())).tolist() if v3 else None
    model = EagleDraft(base, 3 if v3 else 1, bool(cfg.get("bias", True)), used,
                       init_from_base=False)
    model.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()},
                          strict=True)
    capture = [int(x) for x in cfg["eagle3_layers"]] if v3 else []
    return model.to(base.device).eval(), cfg, capture


def pick_draft_vocab(data, n, vocab):
    cnt = Counter()
    for s, p, held in zip(data["seqs"], data["prompt_lens"], data["heldout"]):
        if not held:
            cnt.update(s[p:])
    top = [t for t, _ in cnt.most_common(n)]
    cover = sum(cnt[t] for t in top) / max(1, sum(cnt.values()))
    used = set(top)
    i = 0
    while len(used) < n and i < vocab:  # fewer distinct tokens than draft_V: pad with low ids
        used.add(i)
        i += 1
    return sorted(used), cover


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_base_args(ap)
    C.add_data_args(ap)
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", type=int, choices=[1, 2, 3], default=1)
    ap.add_argument("--no-bias", action="store_true", help="EAGLE-1/2: fc without bias")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="EAGLE-3 draft vocabulary size (default: V/2 for V <= 4096, else "
                         "min(V, 32000) as the official Llama-3 heads)")
    ap.add_argument("--eagle3-layers", default=None, help="override, e.g. 2,15,27")
    ap.add_argument("--random-init", action="store_true",
                    help="EAGLE-3: random lm_head / unit norm as the official code")
    ap.add_argument("--ttt-steps", type=int, default=None,
                    help="unrolled draft steps in training (default 1 for v1/2, 4 for v3)")
    ap.add_argument("--eval-steps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--time-budget", type=float, default=None)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--noise", type=float, default=0.2,
                    help="EAGLE-1/2: uniform noise amplitude on input features")
    ap.add_argument("--p-weight", type=float, default=0.1, help="EAGLE-1/2 CE weight")
    ap.add_argument("--decay", type=float, default=0.8)
    ap.add_argument("--save-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()
    C.setup(args)
    v3 = args.version == 3
    K = args.ttt_steps or (4 if v3 else 1)

    base = C.load_base(args.base, args.device, name=args.base_name)
    data = C.load_or_make_data(args, base)
    dev = base.device
    W = base.lm_head_weight()
    capture = eagle3_layers(base.layers, args.eagle3_layers) if v3 else []
    used, cover = None, None
    if v3:
        dv = args.draft_vocab or (base.vocab // 2 if base.vocab <= 4096 else
                                  min(base.vocab, 32000))
        used, cover = pick_draft_vocab(data, dv, base.vocab)
        C.log(f"eagle3: capture layers {capture}; draft vocab {len(used)} covers "
              f"{100 * cover:.2f}% of training tokens")
    model = EagleDraft(base, args.version, not args.no_bias, used,
                       not args.random_init).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    sched = C.LRSchedule(opt, args.lr, args.warmup, args.steps, args.time_budget)
    amp = dev.type == "cuda"
    train_idx = C.split_indices(data, False)
    rng = random.Random(args.seed)
    C.log(f"eagle v{args.version}: {sum(p.numel() for p in model.parameters())} params, "
          f"ttt steps {K}; {len(train_idx)} train sequences")

    def first_hidden(outs):
        return torch.cat(outs["captured"], -1) if v3 else outs["hidden"]

    predict = eagle_predict(model, base, W, args.eval_steps, amp)

    def run_eval(tag):
        model.eval()
        ev = C.evaluate(base, data, predict, args.eval_steps, capture,
                        batch_tokens=args.batch_tokens, max_len=args.max_len)
        C.print_eval(tag, ev)
        model.train()
        return ev

    ev0 = run_eval(f"eagle{args.version} init")
    t0 = time.time()
    sched.t0 = t0
    step, hist, history = 0, [], []
    t2d_idx = torch.nonzero(model.t2d).squeeze(1) if v3 else None
    while step < args.steps:
        for b in C.make_batches(data, train_idx, args.batch_tokens, True, rng, args.max_len):
            if step >= args.steps or (args.time_budget and time.time() - t0 > args.time_budget):
                break
            ids, lens, plens = C.collate(data, b, dev, args.max_len)
            outs = C.base_outputs(base, ids, capture)
            T = ids.shape[1]
            emb = base.embed(ids)
            hid = first_hidden(outs)
            if not v3 and args.noise > 0:
                hid = hid + (torch.rand_like(hid) - 0.5) * args.noise
            sched.step(step)
            cache, loss, parts = [], 0.0, []
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                for j in range(K):
                    out, cache = model.step(C.shift_left(emb, j + 1), hid, cache)
                    hid = out
                    m = C.valid_mask(lens, plens, T, j + 1)
                    if not m.any():
                        parts.append((0.0, 0.0))
                        continue
                    tl = C.shift_left(outs["logits"], j + 1)[m].float()
                    o = out[m]
                    if v3:
                        in_dv = model.t2d[tl.argmax(-1)].float()
                        p = F.softmax(tl[:, t2d_idx], -1)
                        logp = F.log_softmax(model.logits(o, W).float(), -1)
                        ploss = (-(p * logp).sum(-1) * in_dv).mean()
                        lj, vl = ploss, 0.0
                    else:
                        tf = C.shift_left(outs["hidden"], j + 1)[m].float()
                        vloss = F.smooth_l1_loss(o.float(), tf, reduction="none").mean(-1).mean()
                        p = F.softmax(tl, -1)
                        logp = F.log_softmax(model.logits(o, W).float(), -1)
                        ploss = -(p * logp).sum(-1).mean()
                        lj, vl = vloss + args.p_weight * ploss, float(vloss.detach())
                    loss = loss + (args.decay ** j) * lj
                    parts.append((vl, float(ploss.detach())))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            hist.append(parts)
            step += 1
            if step % args.log_every == 0 or step == 1:
                vavg = [sum(x[j][0] for x in hist) / len(hist) for j in range(K)]
                pavg = [sum(x[j][1] for x in hist) / len(hist) for j in range(K)]
                history.append({"step": step, "vloss_by_step": vavg, "ploss_by_step": pavg})
                msg = f"step {step} ({time.time() - t0:.0f}s) ce by step: " + \
                    " ".join(f"{a:.3f}" for a in pavg)
                if not v3:
                    msg += " | smooth-l1 by step: " + " ".join(f"{a:.4f}" for a in vavg)
                C.log(msg)
                hist = []
        if args.time_budget and time.time() - t0 > args.time_budget:
            break
    train_s = time.time() - t0
    ev = run_eval(f"eagle{args.version} trained")

    os.makedirs(args.out, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items()}
    size = C.save_safetensors(sd, os.path.join(args.out, "model.safetensors"),
                              C.parse_dtype(args.save_dtype))
    cfg = {"architectures": ["LlamaForCausalLMEagle3" if v3 else "LlamaForCausalLM"],
           "model_type": "llama", "hidden_size": base.hidden,
           "intermediate_size": base.inter, "num_attention_heads": base.heads,
           "num_key_value_heads": base.kv_heads, "head_dim": base.head_dim,
           "num_hidden_layers": 1, "vocab_size": base.vocab, "rms_norm_eps": base.eps,
           "rope_theta": base.rope_theta, "max_position_embeddings": base.max_pos,
           "hidden_act": "silu", "tie_word_embeddings": False,
           "bos_token_id": base.bos, "eos_token_id": base.model.config.eos_token_id,
           "torch_dtype": {"fp32": "float32", "bf16": "bfloat16",
                           "fp16": "float16"}[args.save_dtype],
           "base_model_name_or_path": base.name}
    if v3:
        cfg["draft_vocab_size"] = len(used)
        cfg["eagle3_layers"] = capture
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": capture}
        cfg["bias"] = False
    else:
        cfg["bias"] = not args.no_bias
    C.write_json(cfg, os.path.join(args.out, "config.json"))
    C.write_json({"kind": f"eagle{args.version}", "steps": step,
                  "train_seconds": round(train_s, 1), "ttt_steps": K, "args": vars(args),
                  "data": data["meta"], "draft_vocab_coverage": cover,
                  "loss_history": history, "heldout_init": ev0, "heldout": ev},
                 os.path.join(args.out, "train_metrics.json"))
    C.log(f"saved {args.out} (model.safetensors {size} bytes, {args.save_dtype}): "
          + ", ".join(f"{k} {list(v.shape)}" for k, v in sd.items()))


if __name__ == "__main__":
    main()
