#!/usr/bin/env python3
"""Shared pieces of the speculative-decoding head trainers (train_medusa.py, train_eagle.py).

- Base model loading: a Hugging Face directory, a GGUF file (transformers dequantizes it,
  `from_pretrained(dir, gguf_file=...)`; needs the `gguf` package), or a llama2.c `.bin`
  checkpoint (converted in Python by make_golden_fixtures.load_llama2c_as_hf, tokenizer from the
  `tok512.bin` beside it).
- Prompt sets: `stories` (scripts/data/story_openers.txt plus generations from BOS alone),
  `mt_bench` (first turns of mt_bench.jsonl rendered with the model's chat template, plus
  prompts the model writes itself: the chat template up to a user turn, sampled) and
  `instructions` (a JSONL file in MT-bench's schema, e.g. from make_instruction_prompts.py,
  rendered the same way; optionally plus self-written prompts).
- Self-distillation data: the base model's own continuations of those prompts, greedy and
  sampled (temperatures 0.7-1.0), saved as token sequences with a train / held-out split
  (`.pt`: torch.save of lists; `.npz`: compressed flat uint16 tokens, about 1.4 bytes a token).
  With --gen-chunks DIR the generation is saved chunk by chunk and resumes after a stop
  (--gen-time-budget); gen-data then exits with status 3 until every chunk is done.
- Base outputs per batch (final-norm hidden states, logits, residual stream at the input of
  chosen layers) and the evaluation helpers the trainers share.

Generate a data file on its own (the trainers also generate it when --data does not exist):
  python3 scripts/spec_train_common.py gen-data \
      --base ../shared/models/stories260K/stories260K.bin --out /tmp/stories_data.pt
  python3 scripts/spec_train_common.py gen-data --base models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --prompt-set instructions --prompts instructions.jsonl --out /tmp/smollm2_ins.npz \
      --max-new 384 --gen-batch 1024 --gen-dtype bf16 --gen-chunks /tmp/ins_chunks
"""
import argparse
import hashlib
import json
import math
import os
import random
import struct
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# Tokenizer for llama2c tok512.bin (SentencePiece-style BPE with byte fallback, as llama2.c run.c)
# ---------------------------------------------------------------------------------------------
class Llama2cTokenizer:
    def __init__(self, path, vocab_size):
        self.pieces, self.scores = [], []
        with open(path, "rb") as f:
            (self.max_len,) = struct.unpack("i", f.read(4))
            for _ in range(vocab_size):
                score, n = struct.unpack("fi", f.read(8))
                self.pieces.append(f.read(n))
                self.scores.append(score)
        self.lookup = {p: i for i, p in enumerate(self.pieces)}
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1, 2, 0

    def encode(self, text, bos=True):
        ids = []
        if text:
            text = " " + text  # add_dummy_prefix
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.lookup:
                ids.append(self.lookup[b])
            else:
                ids.extend(x + 3 for x in b)  # byte fallback <0x00>.. at ids 3..258
        while True:
            best, best_i, best_id = -1e10, -1, -1
            for i in range(len(ids) - 1):
                m = self.pieces[ids[i]] + self.pieces[ids[i + 1]]
                j = self.lookup.get(m)
                if j is not None and self.scores[j] > best:
                    best, best_i, best_id = self.scores[j], i, j
            if best_i < 0:
                break
            ids[best_i:best_i + 2] = [best_id]
        return ([1] if bos else []) + ids

    def decode(self, ids):
        out = b""
        prev = None
        for t in ids:
            if t in (0, 1, 2):
                prev = t
                continue
            p = self.pieces[t]
            if prev == 1 and p.startswith(b" "):
                p = p[1:]
            if 3 <= t <= 258:
                p = bytes([t - 3])
            out += p
            prev = t
        return out.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Base model
# ---------------------------------------------------------------------------------------------
class Base:
    """A frozen Llama-family model plus what the trainers need to know about it."""

    def __init__(self, model, tokenizer, name, kind, eos_ids):
        self.model = model
        self.tok = tokenizer
        self.name = name
        self.kind = kind  # "llama2c" | "gguf" | "hf"
        self.eos_ids = eos_ids
        c = model.config
        self.hidden = c.hidden_size
        self.vocab = c.vocab_size
        self.layers = c.num_hidden_layers
        self.heads = c.num_attention_heads
        self.kv_heads = c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.inter = c.intermediate_size
        self.eps = float(c.rms_norm_eps)
        rp = getattr(c, "rope_parameters", None) or {}
        self.rope_theta = float(rp.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
        rtype = rp.get("rope_type", "default") if rp else (
            (getattr(c, "rope_scaling", None) or {}).get("rope_type", "default"))
        if rtype != "default":
            log(f"warning: base RoPE type {rtype}: the draft layers use plain RoPE "
                f"(theta {self.rope_theta})")
        self.max_pos = c.max_position_embeddings
        self.bos = c.bos_token_id

    @property
    def device(self):
        return next(self.model.parameters()).device

    def lm_head_weight(self):
        return self.model.lm_head.weight

    def embed(self, ids):
        return self.model.model.embed_tokens(ids)

    def chat_prompt(self, user_text):
        return self.chat_prompts([user_text])[0]

    def chat_prompts(self, user_texts):
        """Token ids of each text as one user message through the chat template."""
        rendered = [self.tok.apply_chat_template([{"role": "user", "content": t}],
                                                 add_generation_prompt=True, tokenize=False)
                    for t in user_texts]
        return self.tok(rendered, add_special_tokens=False)["input_ids"]

    def decode(self, ids):
        return self.tok.decode(ids)


def load_base(path, device="cpu", dtype=torch.float32, name=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = os.path.abspath(path)
    if path.endswith(".bin"):
        from make_golden_fixtures import load_llama2c_as_hf
        model = load_llama2c_as_hf(path)
        tok = Llama2cTokenizer(os.path.join(os.path.dirname(path), "tok512.bin"),
                               model.config.vocab_size)
        # llama2.c stories are separated by BOS; EOS never appears in practice.
        base = Base(model, tok, os.path.basename(path), "llama2c", [1, 2])
    elif path.endswith(".gguf"):
        d, f = os.path.split(path)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        base = Base(model, tok, f, "gguf", _eos_ids(model, tok))
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
        base = Base(model, tok, os.path.basename(path.rstrip("/")), "hf", _eos_ids(model, tok))
    if name:
        base.name = name
    model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return base


def save_base_hf(base, out_dir):
    """Saves the (dequantized) base as a plain HF directory: a GGUF-loaded model refuses
    save_pretrained, so the weights go into a fresh model of the same config."""
    import copy
    from transformers import AutoModelForCausalLM
    cfg = copy.deepcopy(base.model.config)
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(cfg)
    fresh.load_state_dict(base.model.state_dict())
    fresh.save_pretrained(out_dir)
    if hasattr(base.tok, "save_pretrained"):
        base.tok.save_pretrained(out_dir)


def _eos_ids(model, tok):
    ids = set()
    e = model.generation_config.eos_token_id if model.generation_config else None
    for x in ([e] if isinstance(e, int) else (e or [])):
        ids.add(int(x))
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    for s in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"):
        i = tok.convert_tokens_to_ids(s) if s in tok.get_vocab() else None
        if i is not None:
            ids.add(int(i))
    return sorted(ids)


def add_base_args(ap):
    ap.add_argument("--base", required=True,
                    help="base model: HF directory, .gguf file, or llama2.c .bin "
                         "(tok512.bin beside it)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-name", default=None,
                    help="base_model_name_or_path written to the head's config.json "
                         "(default: the base's file or directory name)")


def setup(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# ---------------------------------------------------------------------------------------------
# Prompt sets
# ---------------------------------------------------------------------------------------------
def default_prompt_set(base):
    return "stories" if base.kind == "llama2c" else "mt_bench"


def stories_prompts(base, openers_path):
    """(prompt ids, group, heldout) for the stories set."""
    lines = [l.strip() for l in open(openers_path) if l.strip()]
    out = []
    for i, line in enumerate(lines):
        out.append((base.tok.encode(line), f"opener{i}", i % 5 == 4))
    return out


def mt_bench_prompts(base, jsonl):
    out = []
    for line in open(jsonl):
        q = json.loads(line)
        out.append((base.chat_prompt(q["turns"][0]), f"mt{q['question_id']}",
                    q["question_id"] % 5 == 0))
    return out


def instruction_prompts(base, jsonl, heldout_every, limit=None):
    """(prompt ids, group, heldout) for a JSONL of single-turn instructions in MT-bench's schema;
    question_id % heldout_every == 0 is held out (by prompt, so no reply to a held-out prompt is
    trained on)."""
    rows = [json.loads(line) for line in open(jsonl) if line.strip()][:limit]
    ids = base.chat_prompts([q["turns"][0] for q in rows])
    held = [heldout_every > 0 and q["question_id"] % heldout_every == 0 for q in rows]
    return [(p, f"ins{q['question_id']}", h) for p, q, h in zip(ids, rows, held)]


def reply_temps(spec, k):
    """Temperatures of prompt k's replies: spec is comma-separated slots, each slot one
    temperature or alternatives a|b|... cycled over prompts ("0,0.7|1.0": a greedy reply plus
    one sampled at 0.7 or 1.0, alternating)."""
    out = []
    for slot in spec.split(","):
        alts = [float(x) for x in slot.split("|")]
        out.append(alts[k % len(alts)])
    return out


def self_written_prompts(base, n, max_new, batch, seed):
    """Prompts the model writes itself (Magpie-style): render the chat template up to the start
    of a user turn and sample the user's message at temperature 1."""
    s = base.tok.apply_chat_template([{"role": "user", "content": "XXX"}],
                                     add_generation_prompt=False, tokenize=False)
    prefix = s[:s.index("XXX")]
    pre_ids = base.tok(prefix, add_special_tokens=False)["input_ids"]
    seqs = generate(base, [pre_ids] * n, [1.0] * n, max_new, batch, seed)
    out = []
    eos = set(base.eos_ids)
    for i, s in enumerate(seqs):
        reply = s[len(pre_ids):]
        if not reply or reply[-1] not in eos:
            continue  # unfinished question: skip
        text = base.tok.decode(reply[:-1]).strip()
        if len(text) < 8:
            continue
        out.append((base.chat_prompt(text), f"self{i}", i % 10 == 0))
    return out


# ---------------------------------------------------------------------------------------------
# Generation (batched, left padded; temperature 0 = greedy)
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def generate_group(base, prompts, t, max_new):
    """One transformers generate() call: the prompts left padded, temperature t (0 = greedy).
    Returns each continuation up to and including its first EOS."""
    from transformers import GenerationConfig
    pad = 0
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad, dtype=torch.long)
    att = torch.zeros((len(prompts), L), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, L - len(p):] = torch.tensor(p)
        att[r, L - len(p):] = 1
    max_len = min(max_new, base.max_pos - L)
    gc = GenerationConfig(max_new_tokens=max_len, do_sample=t > 0,
                          temperature=t if t > 0 else None, top_k=0 if t > 0 else None,
                          top_p=1.0 if t > 0 else None, eos_token_id=base.eos_ids,
                          pad_token_id=pad, bos_token_id=base.bos)
    out = base.model.generate(input_ids=ids.to(base.device), attention_mask=att.to(base.device),
                              generation_config=gc)
    out = out[:, L:].cpu().tolist()
    eos = set(base.eos_ids)
    conts = []
    for row in out:
        cont = []
        for x in row:
            cont.append(x)
            if x in eos:
                break
        conts.append(cont)
    return conts


@torch.no_grad()
def generate(base, prompts, temps, max_new, batch, seed):
    order = sorted(range(len(prompts)), key=lambda i: (temps[i], len(prompts[i])))
    results = [None] * len(prompts)
    g = torch.Generator(device="cpu").manual_seed(seed)
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        # One temperature per generate() call.
        by_t = {}
        for i in idx:
            by_t.setdefault(temps[i], []).append(i)
        for t, group in by_t.items():
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
            conts = generate_group(base, [prompts[i] for i in group], t, max_new)
            for i, cont in zip(group, conts):
                results[i] = list(prompts[i]) + cont
        log(f"  generated {min(s + batch, len(order))}/{len(order)}")
    return results


@torch.no_grad()
def generate_chunked(base, prompts, temps, max_new, batch, seed, chunk_dir, time_budget=None):
    """generate() in resumable chunks: the items sorted by (temperature, prompt length) and cut
    into chunks of at most `batch` sequences of one temperature; chunk k is sampled with seed
    (seed, k) and saved to chunk_dir/chunk_k.pt when done. A repeated call with the same plan
    (checked by a hash of prompts, temperatures and settings) skips the chunks already there, so
    the result does not depend on where earlier calls stopped. With time_budget (seconds) no
    chunk starts that would, at the last chunk's pace, end past it. Returns the sequences, or
    None while chunks are missing."""
    order = sorted(range(len(prompts)), key=lambda i: (temps[i], len(prompts[i]), i))
    chunks, cur = [], []
    for i in order:
        if cur and (len(cur) == batch or temps[cur[0]] != temps[i]):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    plan = hashlib.sha256(json.dumps([prompts, temps, max_new, batch, seed]).encode()).hexdigest()
    os.makedirs(chunk_dir, exist_ok=True)
    plan_path = os.path.join(chunk_dir, "plan.txt")
    if os.path.exists(plan_path):
        if open(plan_path).read().strip() != plan:
            raise SystemExit(f"{chunk_dir} holds chunks of another plan: remove it or use another")
    else:
        with open(plan_path, "w") as f:
            f.write(plan + "\n")
    path = lambda k: os.path.join(chunk_dir, f"chunk_{k:05d}.pt")  # noqa: E731
    todo = [k for k in range(len(chunks)) if not os.path.exists(path(k))]
    log(f"  {len(chunks)} chunks of at most {batch} sequences, {len(chunks) - len(todo)} "
        f"already done")
    t0, last, done_tok = time.time(), 0.0, 0
    for n, k in enumerate(todo):
        elapsed = time.time() - t0
        if time_budget and n > 0 and elapsed + last > time_budget:
            log(f"  stopping for the time budget ({elapsed:.0f} s): {len(todo) - n} chunks left")
            return None
        idx = chunks[k]
        torch.manual_seed(seed * 1000003 + k)
        c0 = time.time()
        conts = generate_group(base, [prompts[i] for i in idx], temps[idx[0]], max_new)
        torch.save({"idx": idx, "conts": conts}, path(k) + ".tmp")
        os.replace(path(k) + ".tmp", path(k))
        last = time.time() - c0
        ntok = sum(len(c) for c in conts)
        done_tok += ntok
        rate = done_tok / (time.time() - t0)
        log(f"  chunk {k + 1}/{len(chunks)}: {len(idx)} x t={temps[idx[0]]}, prompts "
            f"{len(prompts[idx[0]])}-{len(prompts[idx[-1]])} tokens, {ntok} generated in "
            f"{last:.1f} s; {rate:.0f} tok/s overall, {len(todo) - n - 1} chunks left")
    results = [None] * len(prompts)
    for k in range(len(chunks)):
        c = torch.load(path(k))
        for i, cont in zip(c["idx"], c["conts"]):
            results[i] = list(prompts[i]) + cont
    return results


def make_data(base, prompt_set, *, openers=None, mt_bench=None, prompts=None, n_self=0,
              max_new=256, batch=64, seed=0, bos_samples=0, limit=None, replies="0,0.7|1.0",
              heldout_every=25, all_heldout=False, chunk_dir=None, time_budget=None):
    """Self-distillation data: dict with seqs, prompt_lens, temps, groups, heldout flags; None
    when a chunked generation (chunk_dir) stopped before the end."""
    t0 = time.time()
    items = []  # (prompt ids, temperature, group, heldout)
    if prompt_set == "stories":
        for p, grp, held in stories_prompts(base, openers)[:limit]:
            for t in (0.0, 0.7, 0.85, 1.0):
                items.append((p, t, grp, held))
        # From BOS alone: the greedy story plus sampled ones (10% held out).
        items.append(([1], 0.0, "bos", True))
        for i in range(bos_samples):
            items.append(([1], (0.7, 0.85, 1.0)[i % 3], f"bos{i}", i % 10 == 0))
    elif prompt_set == "mt_bench":
        for p, grp, held in mt_bench_prompts(base, mt_bench)[:limit]:
            held = held or all_heldout
            for t in ((0.0, 0.7) if held else (0.0, 0.7, 0.85, 1.0)):
                items.append((p, t, grp, held))
    elif prompt_set == "instructions":
        for k, (p, grp, held) in enumerate(instruction_prompts(base, prompts, heldout_every,
                                                               limit)):
            for t in reply_temps(replies, k):
                items.append((p, t, grp, held or all_heldout))
    else:
        raise ValueError(f"unknown prompt set {prompt_set}")
    if prompt_set in ("mt_bench", "instructions"):
        if n_self:
            # Kept beside the chunks: a resumed run must not sample other prompts.
            cache = os.path.join(chunk_dir, f"self_prompts_{n_self}.pt") if chunk_dir else None
            if cache and os.path.exists(cache):
                written = torch.load(cache)
            else:
                log(f"writing {n_self} prompts with the model itself")
                written = self_written_prompts(base, n_self, 96, batch, seed + 1)
                if cache:
                    os.makedirs(chunk_dir, exist_ok=True)
                    torch.save(written, cache)
            for k, (p, grp, held) in enumerate(written):
                items.append((p, (0.0, 0.7, 1.0)[k % 3], grp, held or all_heldout))
    log(f"generating {len(items)} continuations (max_new {max_new}) on {base.device}, "
        f"{next(base.model.parameters()).dtype}")
    p_ids, temps = [x[0] for x in items], [x[1] for x in items]
    if chunk_dir:
        seqs = generate_chunked(base, p_ids, temps, max_new, batch, seed, chunk_dir, time_budget)
        if seqs is None:
            return None
    else:
        seqs = generate(base, p_ids, temps, max_new, batch, seed)
    data = {"seqs": seqs, "prompt_lens": [len(x[0]) for x in items],
            "temps": temps, "groups": [x[2] for x in items],
            "heldout": [bool(x[3]) for x in items],
            "meta": {"base": base.name, "prompt_set": prompt_set, "max_new": max_new,
                     "seed": seed, "n_self": n_self, "bos_samples": bos_samples}}
    if prompt_set == "instructions":
        data["meta"].update({"prompts": os.path.basename(prompts), "prompts_sha256":
                             hashlib.sha256(open(prompts, "rb").read()).hexdigest(),
                             "replies": replies, "heldout_every": heldout_every})
    if all_heldout:
        data["meta"]["all_heldout"] = True
    ntok = sum(len(s) - p for s, p in zip(seqs, data["prompt_lens"]))
    data["meta"].update({"generated_tokens": ntok, "gen_seconds": round(time.time() - t0)})
    log(f"data: {len(seqs)} sequences, {ntok} generated tokens "
        f"({sum(data['prompt_lens'])} prompt tokens), {sum(data['heldout'])} held out, "
        f"{time.time() - t0:.0f}s")
    return data


def save_data(data, path):
    """.npz: compressed flat tokens (uint16 where every id fits) plus per-sequence arrays and the
    meta as JSON; anything else: torch.save."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if not path.endswith(".npz"):
        torch.save(data, path)
        return
    lens = np.array([len(s) for s in data["seqs"]], dtype=np.int64)
    flat = np.fromiter((x for s in data["seqs"] for x in s), dtype=np.int64, count=int(lens.sum()))
    tokens = flat.astype(np.uint16 if flat.max(initial=0) < 65536 else np.int32)
    tmp = path[:-4] + ".tmp.npz"
    np.savez_compressed(tmp, tokens=tokens, lens=lens,
                        prompt_lens=np.array(data["prompt_lens"], dtype=np.int64),
                        temps=np.array(data["temps"], dtype=np.float64),
                        heldout=np.array(data["heldout"], dtype=bool),
                        groups=np.array(data["groups"], dtype=str),
                        meta=np.array(json.dumps(data["meta"])))
    os.replace(tmp, path)


def load_data(path):
    if not path.endswith(".npz"):
        return torch.load(path)
    z = np.load(path)
    flat = z["tokens"].astype(np.int64).tolist()
    ends = np.cumsum(z["lens"]).tolist()
    seqs = [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]
    return {"seqs": seqs, "prompt_lens": z["prompt_lens"].tolist(), "temps": z["temps"].tolist(),
            "heldout": z["heldout"].tolist(), "groups": z["groups"].tolist(),
            "meta": json.loads(str(z["meta"]))}


def add_data_args(ap, names=("--data",)):
    ap.add_argument(*names, dest="data", required=True,
                    help="self-distillation data file (.pt); generated first if it does not exist")
    ap.add_argument("--prompt-set", choices=["stories", "mt_bench", "instructions"], default=None,
                    help="default: stories for llama2.c bases, mt_bench otherwise")
    ap.add_argument("--prompts", default=None,
                    help="instructions set: JSONL of {question_id, turns: [text]} "
                         "(scripts/make_instruction_prompts.py)")
    ap.add_argument("--replies", default="0,0.7|1.0",
                    help="instructions set: temperatures of each prompt's replies, comma-"
                         "separated slots, a|b alternating over prompts")
    ap.add_argument("--heldout-every", type=int, default=25,
                    help="instructions set: question_id %% N == 0 is held out")
    ap.add_argument("--all-heldout", action="store_true",
                    help="mark every sequence held out (an evaluation-only data file)")
    ap.add_argument("--openers", default=os.path.join(ROOT, "scripts", "data",
                                                      "story_openers.txt"))
    ap.add_argument("--mt-bench", default=os.path.join(ROOT, "..", "shared", "data", "prompts",
                                                       "mt_bench.jsonl"))
    ap.add_argument("--self-prompts", type=int, default=None,
                    help="prompts the model writes itself (mt_bench set: default 768; "
                         "instructions set: default 0)")
    ap.add_argument("--bos-samples", type=int, default=300,
                    help="sampled stories from BOS alone (stories set)")
    ap.add_argument("--max-new", type=int, default=None, help="default 256 stories, 320 chat")
    ap.add_argument("--gen-batch", type=int, default=None)
    ap.add_argument("--gen-chunks", default=None,
                    help="save the generation chunk by chunk in this directory and resume from it")
    ap.add_argument("--gen-time-budget", type=float, default=None,
                    help="with --gen-chunks: start no chunk past this many seconds; exit 3 "
                         "while chunks are missing")
    ap.add_argument("--limit-prompts", type=int, default=None,
                    help="use only the first N prompts of the file (smoke tests)")


def load_or_make_data(args, base):
    if os.path.exists(args.data):
        data = load_data(args.data)
        log(f"data: {args.data}: {len(data['seqs'])} sequences ({data['meta']})")
        return data
    ps = args.prompt_set or default_prompt_set(base)
    if ps == "instructions" and not args.prompts:
        raise SystemExit("--prompt-set instructions needs --prompts FILE")
    n_self = args.self_prompts
    if n_self is None:
        n_self = 768 if ps == "mt_bench" else 0
    data = make_data(base, ps, openers=args.openers, mt_bench=args.mt_bench, prompts=args.prompts,
                     n_self=n_self if ps != "stories" else 0,
                     max_new=args.max_new or (256 if ps == "stories" else 320),
                     batch=args.gen_batch or (128 if base.device.type == "cuda" else 64),
                     seed=args.seed, bos_samples=args.bos_samples if ps == "stories" else 0,
                     limit=args.limit_prompts, replies=args.replies,
                     heldout_every=args.heldout_every, all_heldout=args.all_heldout,
                     chunk_dir=args.gen_chunks, time_budget=args.gen_time_budget)
    if data is None:
        log("generation incomplete: run the same command again to resume")
        raise SystemExit(3)
    save_data(data, args.data)
    return data


# ---------------------------------------------------------------------------------------------
# Batches and base outputs
# ---------------------------------------------------------------------------------------------
def split_indices(data, heldout):
    return [i for i, h in enumerate(data["heldout"]) if h == heldout]


def make_batches(data, indices, max_tokens, shuffle, rng=None, max_len=None):
    """Lists of sequence indices, each padded batch at most max_tokens (B x T)."""
    idx = sorted(indices, key=lambda i: len(data["seqs"][i]))
    batches, cur, cur_max = [], [], 0
    for i in idx:
        n = len(data["seqs"][i]) if max_len is None else min(max_len, len(data["seqs"][i]))
        m = max(cur_max, n)
        if cur and m * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, m = [], n
        cur.append(i)
        cur_max = m
    if cur:
        batches.append(cur)
    if shuffle:
        (rng or random).shuffle(batches)
    return batches


def collate(data, batch, device, max_len=None):
    """ids [B,T] (right padded with 0), lens [B], prompt_lens [B]."""
    seqs = [data["seqs"][i][:max_len] if max_len else data["seqs"][i] for i in batch]
    T = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), T), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s)
    lens = torch.tensor([len(s) for s in seqs])
    plens = torch.tensor([data["prompt_lens"][i] for i in batch])
    return ids.to(device), lens.to(device), plens.to(device)


@torch.no_grad()
def base_outputs(base, ids, capture=(), want_logits=True):
    """Runs the frozen base on right-padded ids (causal: padding never reaches real positions).
    Returns dict: hidden = final-norm hidden [B,T,h], logits [B,T,V] (fp32) if wanted,
    captured = list of residual-stream inputs of the layers in `capture` (index L = after the
    last layer, before the final norm)."""
    caps, hooks = {}, []
    m = base.model
    for li in sorted(set(capture)):
        def pre(mod, a, kw, li=li):
            caps[li] = a[0] if a else kw["hidden_states"]
        # Index L: the residual stream after the last layer = the final norm's input.
        mod = m.model.layers[li] if li < len(m.model.layers) else m.model.norm
        hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    out = {}

    def norm_hook(mod, a, o):
        out["hidden"] = o
    hooks.append(m.model.norm.register_forward_hook(norm_hook))
    try:
        h = m.model(input_ids=ids, use_cache=False).last_hidden_state
        out["hidden"] = out.get("hidden", h)
        if want_logits:
            out["logits"] = m.lm_head(out["hidden"]).float()
        out["captured"] = [caps[li] for li in capture]
    finally:
        for hk in hooks:
            hk.remove()
    return out


def valid_mask(lens, plens, T, shift):
    """mask[b,t] = the base's logits at position t+shift (which predict token t+shift+1) exist
    and lie in the generated part (t+shift >= prompt_len-1)."""
    t = torch.arange(T, device=lens.device)[None, :] + shift
    return (t <= lens[:, None] - 1) & (t >= plens[:, None] - 1)


def shift_left(x, k):
    """x[:, t] <- x[:, t+k] (zero fill at the end)."""
    if k == 0:
        return x
    pad = torch.zeros_like(x[:, :k])
    return torch.cat([x[:, k:], pad], dim=1)


def greedy_consistent_len(ids, lens, plens, argmax):
    """Per sequence: first position p (>= prompt_len) where token p != base argmax at p-1, i.e.
    where a (numerically) non-greedy token appears; sequences of greedy data agree up to it."""
    B, T = ids.shape
    ok = torch.ones((B, T), dtype=torch.bool, device=ids.device)
    ok[:, 1:] = ids[:, 1:] == argmax[:, :-1]
    pos = torch.arange(T, device=ids.device)[None, :]
    bad = (~ok) & (pos >= plens[:, None]) & (pos < lens[:, None])
    first_bad = torch.where(bad, pos, torch.full_like(pos, T)).min(dim=1).values
    return torch.minimum(first_bad, lens)


@torch.no_grad()
def evaluate(base, data, predict, steps, capture=(), batch_tokens=8192, max_len=None):
    """Held-out acceptance proxies for a drafter that, at each position t, predicts the tokens
    at t+2 .. t+steps+1 (step j predicts t+j+2; the base itself predicts t+1, the root/bonus).
    predict(outs, ids) -> list of `steps` LongTensors [B,T] of target-vocabulary token ids.
    Returns: acc[j] = P(step j's top-1 == the base's argmax at t+j+1) over held-out positions
    (teacher tokens as inputs: the acceptance rate of step j given steps < j were right), and
    on held-out greedy sequences the mean accepted length of a greedy chain of `steps` drafted
    tokens (1 + leading correct steps; the bonus token counts 1)."""
    idx = split_indices(data, True)
    hits = [0] * steps
    cnt = [0] * steps
    run_sum, run_n = 0.0, 0
    for b in make_batches(data, idx, batch_tokens, False, max_len=max_len):
        ids, lens, plens = collate(data, b, base.device, max_len)
        outs = base_outputs(base, ids, capture)
        am = outs["logits"].argmax(-1)
        preds = predict(outs, ids)
        T = ids.shape[1]
        correct = []
        for j in range(steps):
            m = valid_mask(lens, plens, T, j + 1)
            c = (preds[j] == shift_left(am, j + 1)) & m
            hits[j] += int(c.sum())
            cnt[j] += int(m.sum())
            correct.append(c)
        greedy = torch.tensor([data["temps"][i] == 0.0 for i in b], device=ids.device)
        if greedy.any():
            glen = greedy_consistent_len(ids, lens, plens, am)
            t = torch.arange(T, device=ids.device)[None, :]
            # Chain fully inside the greedy-consistent, generated part.
            ok = greedy[:, None] & (t + steps + 1 < glen[:, None]) & (t >= plens[:, None] - 1)
            run = torch.zeros_like(ids)
            alive = torch.ones_like(ids, dtype=torch.bool)
            for j in range(steps):
                alive = alive & correct[j]
                run = run + alive.long()
            run_sum += float(run[ok].sum())
            run_n += int(ok.sum())
    acc = [h / max(c, 1) for h, c in zip(hits, cnt)]
    tau = 1.0 + run_sum / max(run_n, 1)
    return {"acc": acc, "positions": cnt[0], "chain_accept_len": tau, "chain_positions": run_n}


def print_eval(tag, ev):
    accs = " ".join(f"{a:.3f}" for a in ev["acc"])
    log(f"[{tag}] held-out top-1 acc by step: {accs} ({ev['positions']} positions); "
        f"greedy chain mean accepted length {ev['chain_accept_len']:.3f} "
        f"({ev['chain_positions']} positions)")


class LRSchedule:
    """Linear warmup, then cosine from lr to 0.1 lr. With a time budget the progress is
    max(step / total, elapsed / budget), so a run cut by time still anneals."""

    def __init__(self, opt, lr, warmup, total, time_budget=None):
        self.opt, self.lr, self.warmup, self.total = opt, lr, warmup, max(total, 1)
        self.time_budget = time_budget
        self.t0 = time.time()

    def step(self, i):
        if i < self.warmup:
            f = (i + 1) / self.warmup
        else:
            prog = (i - self.warmup) / max(1, self.total - self.warmup)
            if self.time_budget:
                prog = max(prog, (time.time() - self.t0) / self.time_budget)
            f = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))
        for g in self.opt.param_groups:
            g["lr"] = self.lr * f


def save_safetensors(tensors, path, dtype):
    from safetensors.torch import save_file
    out = {}
    for k, v in tensors.items():
        v = v.detach().cpu()
        if v.is_floating_point():
            v = v.to(dtype)
        out[k] = v.contiguous()
    save_file(out, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)  # safetensors creates the file 0600
    return os.path.getsize(path)


def parse_dtype(s):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[s]


def write_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen-data", help="generate a self-distillation data file")
    add_base_args(g)
    add_data_args(g, ("--data", "--out"))
    g.add_argument("--save-base", default=None,
                   help="also save the base as a HF directory here (faster to load later)")
    g.add_argument("--gen-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="the base's dtype while generating (saved with --save-base as fp32)")
    args = ap.parse_args()
    setup(args)
    base = load_base(args.base, args.device, name=args.base_name)
    if args.save_base:
        save_base_hf(base, args.save_base)
        log(f"saved base to {args.save_base}")
    if args.gen_dtype != "fp32":
        base.model.to(parse_dtype(args.gen_dtype))
    load_or_make_data(args, base)


if __name__ == "__main__":
    main()
