#!/usr/bin/env python3
"""Golden fixtures from Hugging Face transformers (the outside reference for the forward pass).

For tiny random-weight models saved by transformers (Llama with GQA, Llama 3 RoPE scaling,
tied and untied embeddings, Mistral, Qwen2; fp32, bf16, f16 and sharded checkpoints), for
stories260K (converted from the llama2.c checkpoint here, in Python) and for
SmolLM2-135M-Instruct (transformers reads the GGUF and dequantizes it), it writes:
  tests/data/models/<name>/         the checkpoint (tiny models only)
  tests/data/golden/<name>.json     input ids, fp32 logits for every position (or a subset for
                                    large vocabularies), and 32 greedy tokens
Run anywhere torch and transformers are installed (CPU is enough):
  python3 scripts/make_golden_fixtures.py --shared ../shared --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import struct
import zlib

import numpy as np
import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden")
MODELS = os.path.join(ROOT, "tests", "data", "models")
NUM_GREEDY = 32


def tiny_common(vocab=320):
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def tiny_models():
    """(name, model class, config, save dtype, shard size)"""
    yield "llama_gqa", LlamaForCausalLM, LlamaConfig(**tiny_common(), tie_word_embeddings=False,
                                                     rope_theta=10000.0), torch.float32, None
    yield "llama_tied_bf16", LlamaForCausalLM, LlamaConfig(
        **tiny_common(), tie_word_embeddings=True, rope_theta=500000.0), torch.bfloat16, None
    yield "llama3_rope_f16", LlamaForCausalLM, LlamaConfig(
        **tiny_common(), tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), \
        torch.float16, None
    c = tiny_common()
    c.update(num_key_value_heads=1)
    yield "mistral_sharded", MistralForCausalLM, MistralConfig(
        **c, tie_word_embeddings=False, sliding_window=None, rope_theta=10000.0), \
        torch.float32, "200KB"
    yield "qwen2", Qwen2ForCausalLM, Qwen2Config(**tiny_common(), tie_word_embeddings=True,
                                                 rope_theta=1000000.0, use_sliding_window=False), \
        torch.float32, None


def greedy(model, ids, n):
    # Plain argmax loop with a full forward each step: no cache subtleties in the reference.
    out = list(ids)
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([out])).logits[0, -1]
        out.append(int(torch.argmax(logits)))
    return out[len(ids):]


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def r7(x):
    # 7 significant digits: well inside the 1e-4 relative tolerance, half the file size.
    return float(f"{float(x):.7g}")


def write_golden(name, ids, logits, greedy_prompt, greedy_tokens, extra=None, vocab_subset=None):
    doc = {"generator": f"transformers {transformers.__version__}, torch {torch.__version__}",
           "input_ids": [int(i) for i in ids], "greedy_prompt": [int(i) for i in greedy_prompt],
           "greedy_tokens": [int(t) for t in greedy_tokens]}
    if vocab_subset is None:
        doc["logits"] = [[r7(x) for x in row] for row in logits]
    else:
        # Large vocabularies: every position's argmax and max, and the logits at a fixed random
        # subset of ids; the last row in full.
        doc["vocab_subset"] = [int(v) for v in vocab_subset]
        doc["subset_logits"] = [[r7(row[v]) for v in vocab_subset] for row in logits]
        doc["argmax"] = [int(np.argmax(row)) for row in logits]
        doc["row_max"] = [float(np.max(row)) for row in logits]
        doc["last_logits"] = [r7(x) for x in logits[-1]]
    if extra:
        doc.update(extra)
    with open(os.path.join(GOLDEN, name + ".json"), "w") as f:
        json.dump(doc, f)
    print(f"wrote {name}: {len(ids)} ids, greedy {greedy_tokens[:8]}...")


def make_tiny():
    for name, cls, cfg, dtype, shard in tiny_models():
        torch.manual_seed(zlib.crc32(name.encode()))
        cfg.torch_dtype = torch.float32
        model = cls(cfg).eval()
        # Spread the weights so logits are not all near zero (default init std 0.02 is tiny).
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.15)
                elif pname.endswith("bias"):
                    p.normal_(0.0, 0.3)
                else:  # norm weights
                    p.uniform_(0.5, 1.5)
        out_dir = os.path.join(MODELS, name)
        os.makedirs(out_dir, exist_ok=True)
        for f in os.listdir(out_dir):
            os.remove(os.path.join(out_dir, f))
        saved = model.to(dtype)
        saved.save_pretrained(out_dir, max_shard_size=shard or "50GB", safe_serialization=True)
        # The reference computes in fp32 on the weights as stored (bf16/f16 rounded).
        ref = cls.from_pretrained(out_dir, dtype=torch.float32).eval()
        rng = np.random.default_rng(7)
        ids = [1] + [int(x) for x in rng.integers(3, cfg.vocab_size, size=39)]
        write_golden(name, ids, logits_of(ref, ids), ids[:8], greedy(ref, ids[:8], NUM_GREEDY),
                     extra={"saved_dtype": str(dtype).replace("torch.", "")})


def load_llama2c_as_hf(path):
    with open(path, "rb") as f:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("7i", f.read(28))
        data = np.frombuffer(f.read(), dtype=np.float32)
    tied = vocab > 0
    vocab = abs(vocab)
    head = dim // n_heads
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off:off + n].reshape(shape)
        off += n
        return torch.tensor(a.copy())

    emb = take(vocab, dim)
    rms_att = take(n_layers, dim)
    wq = take(n_layers, n_heads * head, dim)
    wk = take(n_layers, n_kv * head, dim)
    wv = take(n_layers, n_kv * head, dim)
    wo = take(n_layers, dim, n_heads * head)
    rms_ffn = take(n_layers, dim)
    w1 = take(n_layers, hidden, dim)
    w2 = take(n_layers, dim, hidden)
    w3 = take(n_layers, hidden, dim)
    rms_final = take(dim)

    def permute(w, heads):  # Meta pairwise -> HF rotate-halves (llama2.c export.py)
        return w.view(heads, head // 2, 2, dim).transpose(1, 2).reshape(heads * head, dim)

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden,
                      num_hidden_layers=n_layers, num_attention_heads=n_heads,
                      num_key_value_heads=n_kv, max_position_embeddings=seq_len,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    sd = {"model.embed_tokens.weight": emb, "model.norm.weight": rms_final,
          "lm_head.weight": emb}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = rms_att[i]
        sd[p + "post_attention_layernorm.weight"] = rms_ffn[i]
        sd[p + "self_attn.q_proj.weight"] = permute(wq[i], n_heads)
        sd[p + "self_attn.k_proj.weight"] = permute(wk[i], n_kv)
        sd[p + "self_attn.v_proj.weight"] = wv[i]
        sd[p + "self_attn.o_proj.weight"] = wo[i]
        sd[p + "mlp.gate_proj.weight"] = w1[i]
        sd[p + "mlp.down_proj.weight"] = w2[i]
        sd[p + "mlp.up_proj.weight"] = w3[i]
    model.load_state_dict(sd, strict=False)
    return model


def make_stories(shared):
    model = load_llama2c_as_hf(os.path.join(shared, "models", "stories260K", "stories260K.bin"))
    rng = np.random.default_rng(11)
    ids = [1] + [int(x) for x in rng.integers(3, 512, size=47)]
    # Greedy from BOS alone: the Lily story.
    write_golden("stories260K", ids, logits_of(model, ids), [1], greedy(model, [1], 200))


def make_smollm2(gguf_path):
    d, f = os.path.split(os.path.abspath(gguf_path))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    text = "The capital of France is Paris. The capital of Germany is"
    ids = tok(text)["input_ids"]
    logits = logits_of(model, ids)
    subset = np.random.default_rng(5).choice(logits.shape[1], size=256, replace=False)
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                   add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat)["input_ids"]
    write_golden("smollm2", ids, logits, chat_ids, greedy(model, chat_ids, NUM_GREEDY),
                 extra={"text": text, "greedy_prompt_text": chat}, vocab_subset=subset)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models",
                                                   "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(GOLDEN, exist_ok=True)
    torch.set_grad_enabled(False)
    if args.only in ("", "tiny"):
        make_tiny()
    if args.only in ("", "stories"):
        make_stories(args.shared)
    if args.only in ("", "smollm2"):
        make_smollm2(args.gguf)


if __name__ == "__main__":
    main()
