#!/usr/bin/env python3
"""Regenerates the weight-loader fixtures in tests/data/loader/ from outside references.

Every expected value comes from a library other than arbor:
  * quants.gguf / quants_expected.json: small tensors of every GGUF storage type, written by
    gguf.GGUFWriter; expected fp32 values from gguf.quants.dequantize (the python `gguf`
    package), expected metadata from gguf.GGUFReader.
  * llama_hf/, llama_hf_sharded_bf16/, qwen2_hf_f16/: tiny random models saved by transformers
    (single file, sharded index, bf16/f16); expected configs from transformers.AutoConfig and
    sampled values from the `safetensors` library.
  * llama.gguf, qwen2.gguf: the same tiny models written the way llama.cpp's
    convert_hf_to_gguf.py writes them (Q/K permuted to the Meta layout for arch llama, rope_freqs
    for Llama 3 scaling); the script checks that transformers' own GGUF loader recovers the HF
    weights from them before writing.
  * llama_v0.bin / llama_v1.bin: the tiny llama exported in llama2.c's legacy and version-1
    formats (as llama2.c's export.py writes them, Q/K in the Meta layout).
  * expected.json, section smollm2: the config transformers reports for
    models/SmolLM2-135M-Instruct.Q4_1.gguf (AutoConfig.from_pretrained(..., gguf_file=...)),
    weight samples from transformers' GGUF loader (dequantized + un-permuted), and raw samples
    from gguf.quants.dequantize.
  * expected.json, section stories260K: samples of /work/shared stories260K.bin read with numpy,
    Q/K un-permuted by transformers' LlamaTensorProcessor (the GGUF reverse permutation).

Usage: python3 scripts/make_loader_fixtures.py [--models-dir models] [--shared-dir ../shared]
"""

import argparse
import copy
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

import gguf
from gguf.quants import dequantize, quantize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data", "loader")
RNG = np.random.default_rng(20240611)


def f32_list(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).ravel()]


# ----------------------------------------------------------------------------------------------
# quants.gguf: every storage type, plus metadata of every value type


def k_quant_blocks(qtype, rows, cols):
    """Random K-quant blocks with sane f16 scales (gguf cannot quantize K types)."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = RNG.integers(0, 256, size=(rows * cols // block_elems, block_bytes), dtype=np.uint8)
    scale_fields = {  # byte offsets of the f16 super-block scale(s), ggml-common.h
        gguf.GGMLQuantizationType.Q2_K: [80, 82],
        gguf.GGMLQuantizationType.Q3_K: [108],
        gguf.GGMLQuantizationType.Q4_K: [0, 2],
        gguf.GGMLQuantizationType.Q5_K: [0, 2],
        gguf.GGMLQuantizationType.Q6_K: [208],
    }[qtype]
    for off in scale_fields:
        scales = RNG.uniform(0.001, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def make_quants():
    path = os.path.join(OUT, "quants.gguf")
    w = gguf.GGUFWriter(path, arch="testarch")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo\nwörld")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 1e-300)
    w.add_array("test.int_array", [1, -2, 3])
    w.add_array("test.string_array", ["a", "", "ccc"])
    w.add_array("test.float_array", [0.5, -1.25])
    w.add_array("test.nested_array", [[1, 2], [3]])

    rows, cols = 2, 256
    base = RNG.standard_normal((rows, cols)).astype(np.float32)
    T = gguf.GGMLQuantizationType
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K,
                  T.Q4_K, T.Q5_K, T.Q6_K]:
        name = "t_" + qtype.name.lower()
        if qtype == T.F32:
            w.add_tensor(name, base)
        elif qtype == T.F16:
            w.add_tensor(name, base.astype(np.float16))
        elif qtype.name.endswith("_K"):
            w.add_tensor(name, k_quant_blocks(qtype, rows, cols), raw_dtype=qtype)
        else:
            w.add_tensor(name, quantize(base, qtype), raw_dtype=qtype)
    # A 3-d tensor: GGUF dims [4, 3, 2] are row-major shape [2, 3, 4].
    w.add_tensor("t_f32_3d", np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(path)
    expected = {"tensors": {}, "metadata": {}}
    for t in r.tensors:
        vals = dequantize(t.data, t.tensor_type)
        expected["tensors"][t.name] = {
            "ggml_type": int(t.tensor_type),
            "type_name": t.tensor_type.name,
            "gguf_dims": [int(d) for d in t.shape],
            "shape": list(vals.shape),
            "values": f32_list(vals),
        }
    for key, field in r.fields.items():
        if key.startswith("test.") or key == "general.alignment" or key == "general.architecture":
            if key == "test.nested_array":
                # GGUFReader flattens nested arrays; record the structure written above.
                expected["metadata"][key] = [[1, 2], [3]]
                continue
            v = field.contents()
            if isinstance(v, float):
                v = float(np.float32(v)) if field.types[0] == gguf.GGUFValueType.FLOAT32 else v
            if isinstance(v, list) and field.types[-1] == gguf.GGUFValueType.FLOAT32:
                v = [float(np.float32(x)) for x in v]
            expected["metadata"][key] = v
    expected["data_offset"] = int(r.data_offset)
    with open(os.path.join(OUT, "quants_expected.json"), "w") as f:
        json.dump(expected, f)


# ----------------------------------------------------------------------------------------------
# tiny HF models


def randomize(model, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def make_hf_models():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    llama_cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=16384,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    llama = LlamaForCausalLM(llama_cfg)
    randomize(llama, 1)
    llama.save_pretrained(os.path.join(OUT, "llama_hf"), safe_serialization=True)
    copy.deepcopy(llama).to(torch.bfloat16).save_pretrained(
        os.path.join(OUT, "llama_hf_sharded_bf16"), safe_serialization=True,
        max_shard_size="20KB")

    qwen_cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=5, eos_token_id=6,
        rope_theta=1000000.0)
    qwen = Qwen2ForCausalLM(qwen_cfg)
    randomize(qwen, 2)
    qwen = qwen.to(torch.float16)
    qwen.save_pretrained(os.path.join(OUT, "qwen2_hf_f16"), safe_serialization=True)
    # generation_config.json overrides config.json: a list of eos ids, first one wins.
    with open(os.path.join(OUT, "qwen2_hf_f16", "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 5, "eos_token_id": [7, 6]}, f)
    return llama, qwen.to(torch.float32)


def safetensors_samples(model_dir, per_tensor=6):
    """name -> {shape, index list, values} read by the safetensors library (torch)."""
    from safetensors import safe_open
    files = [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]
    out = {}
    for fname in sorted(files):
        with safe_open(os.path.join(model_dir, fname), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name).float().numpy().ravel()
                idx = sorted(RNG.choice(t.size, size=min(per_tensor, t.size), replace=False))
                out[name] = {"file": fname, "flat_index": [int(i) for i in idx],
                             "values": f32_list(t[idx]), "sum": float(t.astype(np.float64).sum())}
    return out


def config_summary(cfg):
    """The numbers a loader must report, as transformers.AutoConfig sees them."""
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) else cfg.eos_token_id
    return {
        "model_type": cfg.model_type, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_layers": cfg.num_hidden_layers, "num_heads": cfg.num_attention_heads,
        "num_kv_heads": cfg.num_key_value_heads, "head_dim": head_dim,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": theta,
        "rope_type": rp.get("rope_type", "default"),
        "rope_factor": rp.get("factor"), "rope_low_freq_factor": rp.get("low_freq_factor"),
        "rope_high_freq_factor": rp.get("high_freq_factor"),
        "rope_original_max_position": rp.get("original_max_position_embeddings"),
        "max_position": cfg.max_position_embeddings,
        "tie_embeddings": bool(cfg.tie_word_embeddings),
        "bos_token_id": cfg.bos_token_id, "eos_token_id": eos,
    }


# ----------------------------------------------------------------------------------------------
# GGUF and llama2.c exports of the tiny models


def llamacpp_permute(weights, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate-halves rows -> Meta pairwise rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def llama3_rope_factors(cfg):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_freqs)."""
    import math
    rp = cfg.rope_parameters
    base = rp["rope_theta"]
    dim = cfg.head_dim
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path, arch, model, permute_qk, tokens):
    cfg = model.config
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name("tiny-" + arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges([])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key not in sd:
                    continue
                t = sd[key]
                if permute_qk and gg == "attn_q":
                    t = llamacpp_permute(t, cfg.num_attention_heads, cfg.num_attention_heads)
                if permute_qk and gg == "attn_k":
                    t = llamacpp_permute(t, cfg.num_attention_heads, cfg.num_key_value_heads)
                w.add_tensor(f"blk.{i}.{gg}.{kind}", np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_gguf_with_transformers(path, model):
    """transformers' GGUF loader must recover the HF weights from our GGUF export."""
    import torch
    from transformers import AutoModelForCausalLM
    d, f = os.path.split(path)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    ref = model.state_dict()
    got = loaded.state_dict()
    for k, v in ref.items():
        if k == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if not torch.equal(v.float(), got[k].float()):
            sys.exit(f"transformers reads {k} from {path} differently from the HF model")


def meta_permute_torch_free(w, n_heads):
    """llama2.c export.py permute_reverse: HF rows -> Meta pairwise rows (per head)."""
    dim1, dim2 = w.shape
    return w.reshape(n_heads, 2, dim1 // n_heads // 2, dim2).swapaxes(1, 2).reshape(dim1, dim2)


def write_llama2c(path, model, version):
    cfg = model.config
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    L = cfg.num_hidden_layers
    layer = lambda i, n: sd[f"model.layers.{i}.{n}.weight"]
    wq = [meta_permute_torch_free(layer(i, "self_attn.q_proj"), cfg.num_attention_heads)
          for i in range(L)]
    wk = [meta_permute_torch_free(layer(i, "self_attn.k_proj"), cfg.num_key_value_heads)
          for i in range(L)]
    shared = bool(cfg.tie_word_embeddings)
    with open(path, "wb") as f:
        params = [cfg.hidden_size, cfg.intermediate_size, L, cfg.num_attention_heads,
                  cfg.num_key_value_heads, cfg.vocab_size, 128]
        if version == 0:  # export.py legacy_export
            if not shared:
                params[5] = -params[5]
            f.write(struct.pack("iiiiiii", *params))
            arrays = [sd["model.embed_tokens.weight"]]
            arrays += [layer(i, "input_layernorm") for i in range(L)]
            arrays += wq + wk
            arrays += [layer(i, "self_attn.v_proj") for i in range(L)]
            arrays += [layer(i, "self_attn.o_proj") for i in range(L)]
            arrays += [layer(i, "post_attention_layernorm") for i in range(L)]
            arrays += [layer(i, "mlp.gate_proj") for i in range(L)]
            arrays += [layer(i, "mlp.down_proj") for i in range(L)]
            arrays += [layer(i, "mlp.up_proj") for i in range(L)]
            arrays += [sd["model.norm.weight"]]
            head = cfg.head_dim
            arrays += [RNG.standard_normal((128, head // 2)).astype(np.float32)] * 2  # freq_cis
        else:  # export.py version1_export
            f.write(struct.pack("I", 0x616b3432))
            f.write(struct.pack("i", 1))
            f.write(struct.pack("iiiiiii", *params))
            f.write(struct.pack("B", int(shared)))
            f.write(b"\0" * (256 - f.tell()))
            arrays = [layer(i, "input_layernorm") for i in range(L)]
            arrays += [layer(i, "post_attention_layernorm") for i in range(L)]
            arrays += [sd["model.norm.weight"], sd["model.embed_tokens.weight"]]
            arrays += wq + wk
            arrays += [layer(i, "self_attn.v_proj") for i in range(L)]
            arrays += [layer(i, "self_attn.o_proj") for i in range(L)]
            arrays += [layer(i, "mlp.gate_proj") for i in range(L)]
            arrays += [layer(i, "mlp.down_proj") for i in range(L)]
            arrays += [layer(i, "mlp.up_proj") for i in range(L)]
        if not shared:
            arrays.append(sd["lm_head.weight"])
        for a in arrays:
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())


# ----------------------------------------------------------------------------------------------
# Real models: SmolLM2 GGUF and stories260K


SMOL_SAMPLED = [
    "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight", "model.layers.29.self_attn.q_proj.weight",
    "model.layers.29.self_attn.k_proj.weight", "model.norm.weight",
]


def smollm2_expected(models_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    fname = "SmolLM2-135M-Instruct.Q4_1.gguf"
    path = os.path.join(models_dir, fname)
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run scripts/fetch_default_model.sh first")
    cfg = AutoConfig.from_pretrained(models_dir, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=fname, dtype=torch.float32)
    sd = model.state_dict()
    samples = {}
    for name in SMOL_SAMPLED:
        t = sd[name].numpy()
        idx = [tuple(int(RNG.integers(0, d)) for d in t.shape) for _ in range(40)]
        if name.endswith("k_proj.weight"):  # include a whole row to catch row-order mistakes
            idx += [(70, c) for c in range(0, t.shape[1], 24)]
        samples[name] = {"shape": list(t.shape), "index": [list(i) for i in idx],
                         "values": [float(t[i]) for i in idx]}
    # Raw (GGUF-layout) dequantization by the gguf package, for GgufFile::read_f32 itself.
    r = gguf.GGUFReader(path)
    raw = {}
    for t in r.tensors:
        if t.name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.3.ffn_down.weight",
                      "blk.0.attn_norm.weight"):
            vals = dequantize(t.data, t.tensor_type)
            flat = vals.ravel()
            idx = sorted(int(i) for i in RNG.choice(flat.size, size=100, replace=False))
            raw[t.name] = {"type_name": t.tensor_type.name, "shape": list(vals.shape),
                           "flat_index": idx, "values": f32_list(flat[idx])}
    types = {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"file": fname, "config": config_summary(cfg), "hf_samples": samples,
            "gguf_raw_samples": raw, "tensor_types": types, "tensor_count": len(r.tensors)}


def stories_expected(shared_dir):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    path = os.path.join(shared_dir, "models", "stories260K", "stories260K.bin")
    raw = np.fromfile(path, dtype=np.int32, count=7)
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = [int(x) for x in raw]
    shared = vocab > 0
    vocab = abs(vocab)
    head = dim // heads
    data = np.fromfile(path, dtype=np.float32, offset=28)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = data[pos:pos + n].reshape(shape)
        pos += n
        return a

    emb = take(vocab, dim)
    take(layers, dim)  # rms_att
    wq = take(layers, heads * head, dim)
    wk = take(layers, kv_heads * head, dim)
    take(layers, kv_heads * head, dim)  # wv
    take(layers, dim, heads * head)  # wo
    take(layers, dim)  # rms_ffn
    w1 = take(layers, hidden, dim)
    w2 = take(layers, dim, hidden)
    take(layers, hidden, dim)  # w3
    final = take(dim)
    proc = LlamaTensorProcessor(config={"num_attention_heads": heads,
                                        "num_key_value_heads": kv_heads})
    hf = {
        "model.embed_tokens.weight": emb,
        "model.layers.2.self_attn.q_proj.weight":
            proc._reverse_permute_weights(wq[2], heads, heads),
        "model.layers.4.self_attn.k_proj.weight":
            proc._reverse_permute_weights(wk[4], heads, kv_heads),
        "model.layers.1.mlp.gate_proj.weight": w1[1],
        "model.layers.3.mlp.down_proj.weight": w2[3],
        "model.norm.weight": final,
    }
    samples = {}
    for name, t in hf.items():
        idx = [tuple(int(RNG.integers(0, d)) for d in t.shape) for _ in range(30)]
        samples[name] = {"shape": list(t.shape), "index": [list(i) for i in idx],
                         "values": [float(t[i]) for i in idx]}
    return {"config": {"dim": dim, "hidden_dim": hidden, "n_layers": layers, "n_heads": heads,
                       "n_kv_heads": kv_heads, "vocab_size": vocab, "seq_len": seq_len,
                       "tied": shared},
            "hf_samples": samples}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", default=os.path.join(REPO, "models"))
    ap.add_argument("--shared-dir", default=os.path.join(os.path.dirname(REPO), "shared"))
    args = ap.parse_args()
    import transformers
    from transformers import AutoConfig

    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    make_quants()
    llama, qwen = make_hf_models()
    tokens = [f"tok{i}" for i in range(64)]
    write_gguf(os.path.join(OUT, "llama.gguf"), "llama", llama, True, tokens)
    write_gguf(os.path.join(OUT, "qwen2.gguf"), "qwen2", qwen, False, tokens)
    check_gguf_with_transformers(os.path.join(OUT, "llama.gguf"), llama)
    check_gguf_with_transformers(os.path.join(OUT, "qwen2.gguf"), qwen)
    write_llama2c(os.path.join(OUT, "llama_v0.bin"), llama, 0)
    write_llama2c(os.path.join(OUT, "llama_v1.bin"), llama, 1)

    expected = {"generator": f"scripts/make_loader_fixtures.py; transformers "
                             f"{transformers.__version__}, gguf {gguf.__version__ if hasattr(gguf, '__version__') else '?'}",
                "models": {}}
    for name in ("llama_hf", "llama_hf_sharded_bf16", "qwen2_hf_f16"):
        d = os.path.join(OUT, name)
        cfg = AutoConfig.from_pretrained(d)
        summary = config_summary(cfg)
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):  # generation_config.json ids win, as in transformers generate()
            with open(gen) as f:
                g = json.load(f)
            if g.get("bos_token_id") is not None:
                summary["bos_token_id"] = g["bos_token_id"]
            if g.get("eos_token_id") is not None:
                e = g["eos_token_id"]
                summary["eos_token_id"] = e[0] if isinstance(e, list) else e
        expected["models"][name] = {"config": summary, "tensors": safetensors_samples(d)}
    expected["smollm2"] = smollm2_expected(args.models_dir)
    expected["stories260K"] = stories_expected(args.shared_dir)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=None)
    total = 0
    for root, _, files in os.walk(OUT):
        for fn in files:
            size = os.path.getsize(os.path.join(root, fn))
            total += size
            print(f"{os.path.relpath(os.path.join(root, fn), REPO)}: {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
