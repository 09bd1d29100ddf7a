#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/<target>/).

Small, valid inputs that reach deep into each parser: tiny models (hidden 8, one layer) in the
three checkpoint formats, tiny tokenizers in GGUF metadata and llama2.c tokenizer.bin, texts for
the tokenizers, id streams for the incremental decoder, conversations and template sources for
the chat templates. Deterministic; rerun after changing a target's input format:

    python3 scripts/make_fuzz_corpus.py   # needs numpy and gguf (scripts/setup_python.sh)

Reads SmolLM2's vocabulary (models/, scripts/fetch_default_model.sh) for the decoder's id seeds,
tests/data/chat_templates for the templates and conversations, tests/data/loader/quants.gguf,
and proto/arbor.proto (compiled with grpcio-tools) for the gRPC requests.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

import gguf
from gguf.quants import quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
DATA = os.path.join(ROOT, "tests", "data")
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
RNG = np.random.default_rng(37)

# The tiny Llama every model seed has (safetensors_loader.cc's config.json says the same).
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 8, 16, 1, 2, 1, 16
HEAD_DIM = HIDDEN // HEADS


def target_dir(name):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def write(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def tiny_weights(hidden=HIDDEN, inter=INTER, heads=HEADS, kv_heads=KV_HEADS, bias=False):
    """HF names -> float32 arrays of a tiny Llama (Qwen2 with bias=True)."""
    head_dim = hidden // heads
    w = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,),
         "lm_head.weight": (VOCAB, hidden)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (hidden,)
        w[p + "post_attention_layernorm.weight"] = (hidden,)
        w[p + "self_attn.q_proj.weight"] = (heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = (kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = (kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        w[p + "mlp.gate_proj.weight"] = (inter, hidden)
        w[p + "mlp.up_proj.weight"] = (inter, hidden)
        w[p + "mlp.down_proj.weight"] = (hidden, inter)
        if bias:
            w[p + "self_attn.q_proj.bias"] = (heads * head_dim,)
            w[p + "self_attn.k_proj.bias"] = (kv_heads * head_dim,)
            w[p + "self_attn.v_proj.bias"] = (kv_heads * head_dim,)
    return {k: RNG.standard_normal(s).astype(np.float32) for k, s in w.items()}


# ----------------------------------------------------------------------------------------------
# Checkpoints


def safetensors_bytes(tensors, dtype="F32"):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in sorted(tensors.items()):
        if dtype == "F32":
            raw = a.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        elif dtype == "BF16":
            raw = (a.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
        elif dtype == "I64":
            raw = a.astype("<i8").tobytes()
        header[name] = {"dtype": dtype if a.dtype.kind == "f" else "I64", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def make_safetensors():
    d = target_dir("safetensors_loader")
    w = tiny_weights()
    for dtype in ("F32", "F16", "BF16"):
        write(d, f"tiny_llama_{dtype.lower()}.safetensors", safetensors_bytes(w, dtype))
    tied = {k: v for k, v in w.items() if k != "lm_head.weight"}
    write(d, "tiny_llama_tied.safetensors", safetensors_bytes(tied))
    i64 = safetensors_bytes({"d2t": np.arange(6, dtype=np.int64).reshape(2, 3)}, "I64")
    write(d, "i64_tensor.safetensors", i64)
    write(d, "empty_header.safetensors", struct.pack("<Q", 2) + b"{}")


def meta_permute(w, n_heads):
    """HF rotate-halves rows -> Meta pairwise rows (llama.cpp's converter, llama2.c export)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}

# A byte-level vocabulary (GPT-2 alphabet, "Ġ" is a space) with merges, and a SentencePiece one
# with scores and byte pieces, both of VOCAB tokens.
BYTE_LEVEL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "H", "i", "Ġ", "t", "h", "e",
                     "r", "Ġt", "th", "Ġth", "he", "er", "!"]
BYTE_LEVEL_MERGES = ["Ġ t", "t h", "Ġt h", "h e", "e r"]
SPM_TOKENS = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "▁", "a", "b", "▁a", "ab",
              "▁ab", "c", "d", "<|user|>", "é"]
SPM_TYPES = [2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1]


def write_gguf(path, arch, weights, qtype=None, tokenizer="gpt2", hidden=HIDDEN, heads=HEADS,
               kv_heads=KV_HEADS, inter=INTER, rope_freqs=None):
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name("tiny-" + arch)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_block_count(LAYERS)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0 if rope_freqs is None else 500000.0)
    w.add_vocab_size(VOCAB)
    if rope_freqs is not None:  # Llama 3 rope scaling as llama.cpp stores it
        w.add_tensor("rope_freqs.weight", np.array(rope_freqs, dtype=np.float32))
    if tokenizer == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(BYTE_LEVEL_TOKENS)
        w.add_token_types([3, 3, 3] + [1] * (VOCAB - 3))
        w.add_token_merges(BYTE_LEVEL_MERGES)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        with open(os.path.join(DATA, "chat_templates", "smollm2.jinja")) as f:
            w.add_chat_template(f.read())
    else:
        w.add_tokenizer_model("llama")
        w.add_token_list(SPM_TOKENS)
        w.add_token_types(SPM_TYPES)
        w.add_token_scores([0.0] * 6 + [-float(i) for i in range(VOCAB - 6)])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_space_prefix(True)

    def add(name, a):
        if qtype is not None and a.ndim == 2:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(LAYERS):
        for hf, gg in GGUF_NAMES.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key not in weights:
                    continue
                t = weights[key]
                if arch == "llama" and gg == "attn_q":
                    t = meta_permute(t, heads)
                if arch == "llama" and gg == "attn_k":
                    t = meta_permute(t, kv_heads)
                add(f"blk.{i}.{gg}.{kind}", np.ascontiguousarray(t))
    add("output_norm.weight", weights["model.norm.weight"])
    add("output.weight", weights["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_gguf():
    d = target_dir("gguf_loader")
    write_gguf(os.path.join(d, "tiny_llama_f32.gguf"), "llama", tiny_weights())
    # head_dim 4, theta 500000: the factors of (factor 8, low 1, high 4, original 4096).
    write_gguf(os.path.join(d, "tiny_llama3_rope.gguf"), "llama", tiny_weights(),
               rope_freqs=[1.0, 8.0])
    write_gguf(os.path.join(d, "tiny_qwen2_spm.gguf"), "qwen2", tiny_weights(bias=True),
               tokenizer="llama")
    # Quantized rows need a multiple of 32 values.
    T = gguf.GGMLQuantizationType
    for qtype in (T.Q8_0, T.Q4_1):
        write_gguf(os.path.join(d, f"tiny_llama_{qtype.name.lower()}.gguf"), "llama",
                   tiny_weights(hidden=32, inter=32, heads=4, kv_heads=2), qtype=qtype,
                   hidden=32, heads=4, kv_heads=2, inter=32)
    # Past findings, kept as seeds (docs/fuzzing.md): a block_count of 1.5 billion,
    tiny = open(os.path.join(d, "tiny_llama_f32.gguf"), "rb").read()
    key = b"llama.block_count"
    at = tiny.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    write(d, "huge_block_count.gguf", tiny[:at] + struct.pack("<I", 0x5E000001) + tiny[at + 4:])
    # and a non-UTF-8 string as general.alignment.
    key = b"general.alignment"
    write(d, "alignment_invalid_utf8.gguf",
          b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, len(key)) + key + struct.pack("<IQ", 8, 2) +
          b"\xff\xfe")
    # Every metadata value type and the quantization formats (the loader tests' fixture).
    shutil.copy(os.path.join(DATA, "loader", "quants.gguf"), os.path.join(d, "quants.gguf"))


def llama2c_bytes(version, shared):
    w = tiny_weights()
    layer = lambda n: w[f"model.layers.0.{n}.weight"]
    params = [HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB, 8]
    if version == 0:
        out = struct.pack("7i", *params[:5], VOCAB if shared else -VOCAB, params[6])
        arrays = [w["model.embed_tokens.weight"], layer("input_layernorm"),
                  meta_permute(layer("self_attn.q_proj"), HEADS),
                  meta_permute(layer("self_attn.k_proj"), KV_HEADS), layer("self_attn.v_proj"),
                  layer("self_attn.o_proj"), layer("post_attention_layernorm"),
                  layer("mlp.gate_proj"), layer("mlp.down_proj"), layer("mlp.up_proj"),
                  w["model.norm.weight"], np.zeros((8, HEAD_DIM // 2)), np.zeros((8, HEAD_DIM // 2))]
    else:
        out = struct.pack("<Ii7iB", 0x616B3432, 1, *params, int(shared))
        out += b"\0" * (256 - len(out))
        arrays = [layer("input_layernorm"), layer("post_attention_layernorm"),
                  w["model.norm.weight"], w["model.embed_tokens.weight"],
                  meta_permute(layer("self_attn.q_proj"), HEADS),
                  meta_permute(layer("self_attn.k_proj"), KV_HEADS), layer("self_attn.v_proj"),
                  layer("self_attn.o_proj"), layer("mlp.gate_proj"), layer("mlp.down_proj"),
                  layer("mlp.up_proj")]
    if not shared:
        arrays.append(w["lm_head.weight"])
    return out + b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in arrays)


def llama2c_tokenizer_bytes():
    pieces = ["<unk>", "\n<s>\n", "\n</s>\n"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [" ", "a", " a", "b", "ab", " ab", "é"]
    out = struct.pack("<i", max(len(p.encode()) for p in pieces))
    for i, p in enumerate(pieces):
        raw = p.encode()
        out += struct.pack("<fi", -float(i) if i > 258 else 0.0, len(raw)) + raw
    return out


def make_llama2c():
    d = target_dir("llama2c_loader")
    for version in (0, 1):
        for shared in (False, True):
            name = f"tiny_v{version}_{'tied' if shared else 'untied'}.bin"
            write(d, name, llama2c_bytes(version, shared))
    write(d, "tiny_tokenizer.bin", llama2c_tokenizer_bytes())


# ----------------------------------------------------------------------------------------------
# Tokenizers and chat templates


TEXTS = {
    "ascii": "Hello world! The quick brown fox jumps over the lazy dog.",
    "digits": "In 2024, 1234567 people paid $3.14 each (about 12,345.67 EUR).",
    "whitespace": "  leading\tand  trailing \n\n\r\n   spaces   ",
    "code": "def f(x):\n    return {'a': [x, x ** 2]}  # comment\n",
    "multilingual": "Grüße, café, naïve — 日本語のテキスト, 한국어, русский текст, عربى",
    "emoji": "🙂👍🏽 flags 🇫🇷 zwj 👩‍💻 ✓",
    "special_tokens": "<|im_start|>user\nHi<|im_end|>\n<|endoftext|><s></s><unk>",
    "space_marker": "▁already▁marked ▁ text",
    "contractions": "I'm you're he'll we've don't 'quoted' \"double\"",
    "long_word": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
}


def make_tokenizer_encode():
    d = target_dir("tokenizer_encode")
    for name, text in TEXTS.items():
        write(d, name + ".txt", text)
    write(d, "invalid_utf8.bin", b"ok \xff\xfe bad \xc3 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \x04\x00")
    write(d, "all_bytes.bin", bytes(range(256)))


def gpt2_byte_alphabet():
    """GPT-2's bytes_to_unicode: byte -> the character that stands for it in the vocabulary."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    mapping, n = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


def make_incremental_decode():
    d = target_dir("tokenizer_incremental_decode")
    r = gguf.GGUFReader(SMOLLM2)
    field = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    index = {t: i for i, t in enumerate(tokens)}
    alphabet = gpt2_byte_alphabet()

    def ids_of_bytes(data):  # one single-byte token per byte (splits characters across tokens)
        return [index[alphabet[b]] for b in data if alphabet[b] in index]

    def pack(mode, ids):
        return bytes([mode]) + b"".join(struct.pack("<H", i) for i in ids)

    words = [index[t] for t in ("Hello", "Ġworld", "!", "Ċ") if t in index]
    specials = [index[t] for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>") if t in index]
    split_chars = ids_of_bytes("é🙂日".encode())
    broken = ids_of_bytes(b"\xf0\x9f\x98a\xc3")  # an incomplete emoji, then a dangling lead byte
    # mode bits: 1 tokenizer (0 SmolLM2, 1 tok512), 2 skip_special, 4 at_text_start, >>3 split
    write(d, "words.bin", pack(0b100, words))
    write(d, "split_chars.bin", pack(0b100, split_chars))
    write(d, "split_chars_continuing.bin", pack(0b000 | (3 << 3), split_chars))
    write(d, "specials_skipped.bin", pack(0b110, specials + words + specials))
    write(d, "specials_kept.bin", pack(0b100, specials + words))
    write(d, "broken_utf8_reused.bin", pack(0b100 | (2 << 3), broken + words + broken))
    write(d, "out_of_vocab.bin", pack(0b100, words[:1] + [65000, 65001] + words[1:]))
    # tok512: "<0xC3>" "<0xA9>" are ids 3 + 0xC3 and 3 + 0xA9 (after <unk> <s> </s>).
    write(d, "tok512_bytes.bin", pack(0b101, [3 + 0xC3, 3 + 0xA9, 300, 3 + 0xFF, 1, 2, 400]))
    write(d, "tok512_continuing.bin", pack(0b011, [300, 301, 302, 3 + 0x20, 303]))


def make_chat_template():
    d = target_dir("chat_template")
    expected = json.load(open(os.path.join(DATA, "chat_templates", "expected.json")))
    seen = set()
    for tname, tpl in expected["templates"].items():
        for case in tpl["cases"]:
            body = json.dumps({"messages": case["messages"],
                               "add_generation_prompt": case["add_generation_prompt"]},
                              ensure_ascii=False)
            if body in seen:
                continue
            seen.add(body)
            write(d, f"{tname}_{case['name']}.json", body)
    write(d, "array.json", json.dumps([{"role": "user", "content": "Hi"}]))
    write(d, "not_strings.json", json.dumps([{"role": 1, "content": [{"type": "text"}]}, {}]))
    # Not JSON: parts split at 0x1E, the first byte of each picks the role.
    write(d, "bytes_mode.bin", b"\x00Be brief.\x1e\x01Hi there \xc3\xa9\x1e\x02Hello!\x1e\x01")
    write(d, "bytes_mode_generation.bin", b"\x81What is 2 + 2?")


def make_chat_template_source():
    d = target_dir("chat_template_source")
    src = os.path.join(DATA, "chat_templates")
    for name in sorted(os.listdir(src)):
        if name.endswith(".jinja"):
            shutil.copy(os.path.join(src, name), os.path.join(d, name))
    write(d, "features.jinja",
          "{% set ns = namespace(n=0) %}{% macro m(x, y=2) %}{{ x ~ y }}{% endmacro %}"
          "{% for k, v in {'a': 1, 'b': [1, 2]}.items() if k != 'c' %}{{ loop.index }}{{ k|upper }}"
          "{{ v|tojson }}{% set ns.n = ns.n + 1 %}{% else %}none{% endfor %}{{ m(1) }}{{ ns.n }}"
          "{{ messages|map(attribute='role')|join(',') }}{{ 'x'[1:] ~ (3 // 2) ~ (7 % 3) }}"
          "{% if messages[0].content is string and not none %}{{ raise_exception('no') }}{% endif %}"
          "{# comment #}{%- raw %}{{ raw }}{% endraw -%}")
    # Past findings, kept as seeds (docs/fuzzing.md): unbounded recursion and nesting.
    write(d, "recursive_macro.jinja", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}")
    write(d, "deep_nesting.jinja", "{{ " + "(" * 300 + "1" + ")" * 300 + " }}")
    write(d, "integer_overflow.jinja",
          "{{ 9223372036854775807 + 1 }}{{ 2 ** 64 }}{{ (-9223372036854775807 - 1) // -1 }}"
          "{{ [9223372036854775807, 1]|sum }}{{ 1e308|int }}{{ range(9223372036854775800, "
          "9223372036854775807, 5)|list }}")
    # (The runaway templates of that finding take seconds each here: they stay in the unit test.)


# ----------------------------------------------------------------------------------------------
# Server requests


OPENAI_BODIES = {
    "completion": {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time",
                   "max_tokens": 16, "temperature": 0},
    "completion_full": {"prompt": ["a", "b c"], "max_tokens": 8, "n": 2, "temperature": 0.7,
                        "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 18446744073709551615,
                        "presence_penalty": 0.5, "frequency_penalty": -0.5,
                        "repetition_penalty": 1.1, "stop": ["\n", "The"], "logprobs": 3,
                        "echo": True, "stream": True, "stream_options": {"include_usage": True},
                        "logit_bias": {"42": -100, "7": 5.5}, "ignore_eos": True,
                        "speculate": False, "user": "u1", "best_of": 2, "suffix": None},
    "completion_token_ids": {"prompt": [1, 2, 3, 49151], "max_tokens": 4},
    "completion_token_batches": {"prompt": [[1, 2], [3]], "max_tokens": 1, "stop": "x"},
    "chat": {"model": "SmolLM2-135M-Instruct", "max_tokens": 32, "temperature": 0,
             "messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "What is the capital of France?"}]},
    "chat_full": {"messages": [{"role": "developer", "content": "x"},
                               {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                            {"type": "text", "text": "there"}],
                                "name": "bob"},
                               {"role": "assistant", "content": None,
                                "tool_calls": [{"id": "c1", "type": "function",
                                                "function": {"name": "f", "arguments": "{}"}}]},
                               {"role": "tool", "content": "42", "tool_call_id": "c1"}],
                  "max_completion_tokens": 5, "logprobs": True, "top_logprobs": 2, "n": 3,
                  "stream": True, "response_format": {"type": "text"}, "parallel_tool_calls": False,
                  "stop": ["<|im_end|>"], "seed": -1, "logit_bias": {"0": 1}},
    "chat_refused": {"messages": [{"role": "user", "content": "x"}],
                     "tools": [{"type": "function", "function": {"name": "f"}}],
                     "tool_choice": "auto", "response_format": {"type": "json_object"}},
    "wrong_types": {"prompt": {"a": 1}, "max_tokens": "16", "temperature": [1], "n": 2.5,
                    "stream": "yes", "messages": "hi", "model": 3},
}


def make_openai_request():
    d = target_dir("openai_request")
    for name, body in OPENAI_BODIES.items():
        write(d, name + ".json", json.dumps(body, ensure_ascii=False))
    write(d, "deep.json", "[" * 70 + "]" * 70)
    write(d, "not_json.txt", "prompt=hello&max_tokens=5")


def make_grpc_request():
    """Serialized arbor.v1.GenerateRequest messages (Python stubs generated from proto/)."""
    import importlib
    import tempfile
    from grpc_tools import protoc  # scripts/setup_python.sh installs grpcio-tools
    d = target_dir("grpc_request")
    with tempfile.TemporaryDirectory() as tmp:
        proto_dir = os.path.join(ROOT, "proto")
        if protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={tmp}",
                        os.path.join(proto_dir, "arbor.proto")]) != 0:
            sys.exit("protoc failed on proto/arbor.proto")
        sys.path.insert(0, tmp)
        pb = importlib.import_module("arbor_pb2")
        sys.path.pop(0)
    msgs = {
        "text": pb.GenerateRequest(text="Once upon a time", max_tokens=16, temperature=0.0),
        "token_ids": pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2, 3, 49151]),
                                        max_tokens=4),
        "full": pb.GenerateRequest(model="SmolLM2-135M-Instruct", text="<|im_start|>user\nHi",
                                   max_tokens=8, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                                   seed=2**64 - 1, presence_penalty=0.5, frequency_penalty=-0.5,
                                   repetition_penalty=1.1, stop=["\n", "The"], n=2, logprobs=3,
                                   ignore_eos=True, speculate=False, add_bos=False,
                                   logit_bias={42: -100.0, 7: 5.5}),
        "other_model": pb.GenerateRequest(model="gpt-4", text="x"),
        "no_prompt": pb.GenerateRequest(max_tokens=1),
        "bad_values": pb.GenerateRequest(text="x", max_tokens=-1, n=0, logprobs=-1, top_k=-2,
                                         temperature=float("nan"), logit_bias={-1: 1000.0}),
    }
    for name, msg in msgs.items():
        write(d, name + ".bin", msg.SerializeToString())


def main():
    if not os.path.exists(SMOLLM2):
        sys.exit(f"{SMOLLM2} is missing: run scripts/fetch_default_model.sh first")
    make_tokenizer_encode()
    make_incremental_decode()
    make_chat_template()
    make_chat_template_source()
    make_gguf()
    make_safetensors()
    make_llama2c()
    make_openai_request()
    make_grpc_request()
    for name in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, name))
        size = sum(os.path.getsize(os.path.join(OUT, name, f)) for f in files)
        print(f"{name}: {len(files)} files, {size} bytes")


if __name__ == "__main__":
    main()
