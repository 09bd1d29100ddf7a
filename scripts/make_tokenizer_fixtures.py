#!/usr/bin/env python3
"""Regenerates tests/data/tokenizer/: reference token ids and decoded text for the C++ tokenizer
tests, produced by the Hugging Face `tokenizers` library (and SentencePiece for tok512).

Reference tokenizers:
  smollm2     SmolLM2-135M-Instruct: transformers reads the tokenizer out of the GGUF
              (models/SmolLM2-135M-Instruct.Q4_1.gguf); our side loads the same GGUF.
  bpe_gpt2    a small byte-level BPE trained here with the GPT-2 ByteLevel pre-tokenizer
  bpe_llama3  the same with a Llama-3 Split regex + ByteLevel(use_regex=False), ignore_merges
  bpe_qwen2   the same with the Qwen2 regex (single digits)
  bpe_smollm  the same with Digits(individual_digits) + ByteLevel (SmolLM2's configuration)
  tok512      stories260K's llama2.c tok512.bin, rebuilt as HF's LlamaConverter does (BPE with
              byte_fallback, merges from the vocabulary by score, Prepend/Replace "▁"
              normalizer) and checked against a SentencePiece model built from the same pieces.

Usage: python3 scripts/make_tokenizer_fixtures.py   (needs tokenizers, transformers, gguf,
       sentencepiece, protobuf; reads ../shared/models/stories260K/tok512.bin and models/)
Training is deterministic, so a rerun with the same library versions rewrites the same files.
"""
import json
import os
import pathlib
import struct
import sys
import tempfile

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ARBOR_SHARED_DIR", ROOT.parent / "shared"))
MODELS = pathlib.Path(os.environ.get("ARBOR_MODELS_DIR", ROOT / "models"))
OUT = ROOT / "tests" / "data" / "tokenizer"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

# The test corpus: English, CJK, emoji, code, whitespace runs, numbers, contractions, special
# token strings (each tokenizer's own are added below), and unusual Unicode whitespace.
CORPUS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    " leading space",
    "trailing spaces   ",
    "  two leading spaces",
    "multiple   internal    spaces and a tab\there",
    "tabs\tand\t\ttabs\t",
    "line1\nline2\n\nline4\r\nwindows\r\n",
    "\n\n\n",
    "   \n  \n\t \n ",
    " ",
    "  ",
    "\t",
    "a",
    "!!!",
    "...?!",
    "I'm sure they'll say it's fine, don't you think? We've seen it. I'd go. He's OK.",
    "CAPS: I'M SURE THEY'LL SAY IT'S FINE, WE'VE SEEN IT, I'D GO",
    "'s 'S 're 'RE x' '' ' 'll'",
    "long s: it'\u017f done, don'T",
    "Numbers 12345 and 3.14159 and 1,000,000 and 0.5% on 2024-01-15 at 10:30",
    "1234567890 12 123 1234 a1b22c333d4444",
    "digits \u0661\u0662\u0663 \u2155 \u00b2\u00b3 \u4e00\u4e8c\u4e09 \uff11\uff12",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade \u00c5ngstr\u00f6m Stra\u00dfe",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca \u30fc",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
    "\u0420\u043e\u0441\u0441\u0438\u044f \u0438 \u0423\u043a\u0440\u0430\u0457\u043d\u0430",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "Emoji: \U0001F600\U0001F44D\U0001F3FD\U0001F1FA\U0001F1F8 and \u2764\ufe0f \U0001F916\U0001F9E0!",
    "\U0001F600",
    "def foo(x):\n    return x ** 2  # square\n\nclass Bar:\n\tpass\n",
    'if (a != b && c >= d) { printf("%d\\n", a[i]); } // done',
    "    indented\n        more\n",
    "nbsp\u00a0and\u3000ideographic\u2003em\u200bzero-width\u0085nel\x0bvt\x0cff\x1cfs\x1fus end",
    "mixed \u00a0 \u00a0spaces\u3000\u3000x",
    "\u2581 a literal lower one eighth block \u2581\u2581",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! 42 times.",
    "e\u0301 combining accent, \u00e9 precomposed",
    "<think>tags</think> and <b>html</b> & entities &amp;",
]

# Invalid UTF-8 to encode: decode(encode(bytes)) must give the bytes back, repaired as the
# reference decoders repair them (byte-level: Python's / Rust's one U+FFFD per maximal bad
# subpart; SentencePiece: one U+FFFD per bad byte piece).
BAD_UTF8 = [b"ab\xffcd", b"\x80", b"x \xc3 y", b"\xfe\xff", b"ok\xed\xa0\x80ok", b"\xe4\xbd",
            b"\xf0\x9f\x98"]


def special_strings(tokens):
    return [
        f"{tokens[0]}user\nHello{tokens[1]}\n",
        f"{tokens[0]}{tokens[1]} {tokens[0]} x{tokens[1]}y",
        f"before {tokens[0]}",
        f"{tokens[0][:-1]} not quite {tokens[1][1:]}",
    ]


def cases_for(tok, corpus, with_bos=False):
    cases = []
    for text in corpus:
        tok.encode_special_tokens = True
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        ids_special = tok.encode(text, add_special_tokens=False).ids
        case = {
            "text": text,
            "ids": ids,
            "ids_special": ids_special,
            "decoded": tok.decode(ids_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids_special, skip_special_tokens=True),
        }
        if with_bos:
            case["ids_bos"] = tok.encode(text, add_special_tokens=True).ids
        cases.append(case)
    return cases


def write_json(path, obj):
    """One line per list entry: small files that still diff well."""
    def dump(value, indent):
        if isinstance(value, dict) and indent < 1:
            items = [f'{" " * (indent + 1)}{json.dumps(k)}: {dump(v, indent + 1)}'
                     for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = [" " * (indent + 1) + json.dumps(v, ensure_ascii=False) for v in value]
            return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
        return json.dumps(value, ensure_ascii=False)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(obj, 0) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")


def bad_utf8_cases(missing_bytes=(), decode=None):
    """Bytes the vocabulary lacks are dropped by the encoder (as HF and llama.cpp do)."""
    decode = decode or (lambda raw: raw.decode("utf-8", "replace"))
    return [{"hex": b.hex(), "decoded": decode(bytes(c for c in b if c not in missing_bytes))}
            for b in BAD_UTF8]


# ---------------------------------------------------------------------------------------------
# (a) SmolLM2 from its GGUF
def smollm2():
    import gguf
    from transformers import AutoTokenizer

    reader = gguf.GGUFReader(str(MODELS / SMOLLM_GGUF))
    field = lambda key: reader.fields[key].contents()
    pre = field("tokenizer.ggml.pre")
    assert pre == "smollm", pre
    types = field("tokenizer.ggml.token_type")
    gguf_spec = {  # what tokenizer_spec_from_gguf must read, as the gguf package reads it
        "vocab_size": len(field("tokenizer.ggml.tokens")),
        "num_merges": len(field("tokenizer.ggml.merges")),
        "control_ids": [i for i, t in enumerate(types) if t == 3],
        "bos_id": field("tokenizer.ggml.bos_token_id"),
        "eos_id": field("tokenizer.ggml.eos_token_id"),
        "unk_id": field("tokenizer.ggml.unknown_token_id"),
        "pad_id": field("tokenizer.ggml.padding_token_id"),
        "add_bos": field("tokenizer.ggml.add_bos_token"),
        "pre": pre,
        "chat_template": field("tokenizer.chat_template"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        AutoTokenizer.from_pretrained(str(MODELS), gguf_file=SMOLLM_GGUF).save_pretrained(tmp)
        tok = Tokenizer.from_file(os.path.join(tmp, "tokenizer.json"))
    # transformers' GGUF conversion writes a bare ByteLevel pre-tokenizer. SmolLM2's own
    # tokenizer.json and llama.cpp's "smollm" pre-tokenizer (the GGUF's tokenizer.ggml.pre) split
    # digits one by one first; restore that so the reference is the real SmolLM2 tokenizer.
    plain = Tokenizer.from_str(tok.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    corpus = CORPUS + special_strings(["<|im_start|>", "<|im_end|>"]) + [
        "<|endoftext|><repo_name>x<file_sep>", "<|im_start|>system\nYou are a helpful AI "
        "assistant named SmolLM, trained by Hugging Face<|im_end|>\n"]
    cases = cases_for(tok, corpus)
    differ = sum(plain.encode(c["text"]).ids != c["ids_special"] for c in cases)
    # Byte tokens of a split emoji and stray bytes, decoded. (SmolLM2's vocabulary lacks 21 of
    # the 256 bytes, e.g. 0x04, 0xC0, 0xF1, 0xFF: HF and llama.cpp drop such bytes when encoding.)
    byte_id = {b: tok.token_to_id(ch) for b, ch in enumerate(bytes_to_unicode())}
    missing_bytes = [b for b, i in byte_id.items() if i is None]
    emoji = "\U0001F916".encode()
    decode_cases = []
    for ids in ([byte_id[b] for b in emoji], [byte_id[0xE2], byte_id[0x82], tok.token_to_id("a")],
                [byte_id[0xC3], 1, byte_id[0x80]], [tok.token_to_id("Ġhello"), byte_id[0xF0]]):
        for skip in (False, True):
            decode_cases.append({"ids": ids, "skip_special": skip,
                                 "decoded": tok.decode(ids, skip_special_tokens=skip)})
    write_json(OUT / "smollm2_cases.json", {
        "reference": f"tokenizers {tokenizers.__version__}: tokenizer.json that transformers "
                     f"builds from {SMOLLM_GGUF}, pre-tokenizer Digits + ByteLevel",
        "note": f"{differ} of {len(cases)} cases differ with transformers' bare ByteLevel",
        "bytes_missing_from_vocab": missing_bytes,
        "gguf_spec": gguf_spec,
        "cases": cases, "decode_cases": decode_cases,
        "bad_utf8": bad_utf8_cases(missing_bytes)})


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


# ---------------------------------------------------------------------------------------------
# (b) small byte-level BPEs trained here
def training_text():
    words = ("the a and to was she he it they little girl boy dog cat sun happy day play "
             "friend tree ball house mom dad said went saw big red blue green run jump "
             "because very could would there their then when what who why how").split()
    lines = []
    for i in range(600):  # a deterministic pseudo-story
        w = [words[(i * 7 + k * 13) % len(words)] for k in range(9)]
        lines.append(" ".join(w).capitalize() + f". It's {i % 97} o'clock, we'll see {i * 31}!")
    code = ("def main(argv):\n    for i in range(10):\n        print(f\"{i}: {argv[i]!r}\")\n"
            "    return 0\n\nif __name__ == '__main__':\n\tsys.exit(main(sys.argv))\n") * 20
    return lines + [code] + CORPUS * 5


def train_byte_level(name, pre_tokenizer, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1100, show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    # A non-special added token: matched in text even when special tokens are not parsed.
    tok.add_tokens([AddedToken("[[user_token]]", special=False, normalized=False)])
    (OUT / name).mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / name / "tokenizer.json"))
    print(f"wrote tests/data/tokenizer/{name}/tokenizer.json")
    tok = Tokenizer.from_file(str(OUT / name / "tokenizer.json"))
    corpus = CORPUS + special_strings(["<|im_start|>", "<|im_end|>"]) + [
        "[[user_token]] and <|endoftext|>[[user_token]]x"]
    byte_id = {b: tok.token_to_id(ch) for b, ch in enumerate(bytes_to_unicode())}
    decode_cases = [{"ids": ids, "skip_special": skip,
                     "decoded": tok.decode(ids, skip_special_tokens=skip)}
                    for ids in ([byte_id[b] for b in "\U0001F9E0".encode()],
                                [byte_id[0xE4], byte_id[0xBD], 2, byte_id[0xA0]],
                                [byte_id[0xC3], byte_id[0x28]])
                    for skip in (False, True)]
    write_json(OUT / f"{name}_cases.json", {
        "reference": f"tokenizers {tokenizers.__version__}: {name}/tokenizer.json",
        "cases": cases_for(tok, corpus), "decode_cases": decode_cases,
        "bad_utf8": bad_utf8_cases()})


# ---------------------------------------------------------------------------------------------
# (c) stories260K tok512.bin
def read_tok512():
    data = (SHARED / "models" / "stories260K" / "tok512.bin").read_bytes()
    (max_len,) = struct.unpack_from("<i", data, 0)
    pos, pieces = 4, []
    while pos < len(data):
        score, length = struct.unpack_from("<fi", data, pos)
        pos += 8
        raw = data[pos:pos + length].decode("utf-8")
        pos += length
        pieces.append((raw, score))
    assert len(pieces) == 512 and max(len(p.encode()) for p, _ in pieces) <= max_len
    out = []
    for i, (raw, score) in enumerate(pieces):
        if raw == "\n<s>\n":
            out.append(("<s>", score, 3))  # CONTROL
        elif raw == "\n</s>\n":
            out.append(("</s>", score, 3))
        elif raw == "<unk>":
            out.append((raw, score, 2))  # UNKNOWN
        elif 3 <= i <= 258:
            assert raw == f"<0x{i - 3:02X}>", raw
            out.append((raw, score, 6))  # BYTE
        else:
            out.append((raw.replace(" ", "\u2581"), score, 1))  # NORMAL
    return out


def tok512_hf(pieces):
    from transformers.tokenization_utils_base import generate_merges

    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    merges = generate_merges(vocab, [(p, s) for p, s, _ in pieces])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    tok.add_special_tokens([AddedToken(p, normalized=False, special=True)
                            for p, _, t in pieces if t in (2, 3)])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def tok512_decode_cases(tok, sp):
    """Byte pieces (ids 3 + byte) of split characters and stray bytes, and special tokens."""
    byte = {b: 3 + b for b in range(256)}
    cases = []
    for ids in ([byte[b] for b in "\U0001F600".encode()], [byte[0xE2], byte[0x82], 261],
                [1, 261, byte[0xFF], 2], [byte[0x20], 261], [byte[0xC3], byte[0xA9], 274]):
        for skip in (False, True):
            cases.append({"ids": ids, "skip_special": skip,
                          "decoded": tok.decode(ids, skip_special_tokens=skip),
                          "decoded_sentencepiece": sp.decode(ids)})
    return cases


def tok512_bad_utf8(sp):
    # SentencePiece decoding the bytes as byte pieces <0xXX> (ids 3 + byte)
    return bad_utf8_cases(decode=lambda raw: sp.decode([3 + b for b in raw]))


def tok512_sentencepiece(pieces):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(pieces)
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id = 0, 1, 2
    m.trainer_spec.pad_id = -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False  # what llama2.c and HF do
    m.normalizer_spec.escape_whitespaces = True
    for p, s, t in pieces:
        piece = m.pieces.add()
        piece.piece, piece.score, piece.type = p, s, t
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def tok512():
    pieces = read_tok512()
    tok = tok512_hf(pieces)
    sp = tok512_sentencepiece(pieces)
    d = OUT / "tok512_hf"
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    write_json(d / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": None,
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    corpus = CORPUS + special_strings(["<s>", "</s>"]) + ["<unk> and <s> </s><s>"]
    cases = cases_for(tok, corpus, with_bos=True)
    disagreements = []
    for c in cases:
        c["ids_sentencepiece"] = sp.encode(c["text"])
        if c["ids_sentencepiece"] != c["ids"]:
            disagreements.append(c["text"])
    decode_cases = tok512_decode_cases(tok, sp)
    write_json(OUT / "tok512_cases.json", {
        "reference": f"tokenizers {tokenizers.__version__}: tok512_hf/tokenizer.json (LlamaConverter"
                     " style); ids_sentencepiece: sentencepiece " + sp_version(),
        "hf_sentencepiece_disagreements": disagreements,
        "cases": cases, "decode_cases": decode_cases,
        "bad_utf8": tok512_bad_utf8(sp)})
    if disagreements:
        print(f"tok512: HF and SentencePiece disagree on {len(disagreements)} texts: "
              f"{disagreements}", file=sys.stderr)


def tok512_metaspace(scheme):
    """tok512 as transformers converts Llama with legacy=False: no normalizer, a Metaspace
    pre-tokenizer (prepend_scheme "first" or "always", split=False), the same decoder."""
    pieces = read_tok512()
    sp = tok512_sentencepiece(pieces)
    tok = tok512_hf(pieces)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme,
                                                 split=False)
    name = f"tok512_metaspace_{scheme}"
    (OUT / name).mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / name / "tokenizer.json"))
    tok = Tokenizer.from_file(str(OUT / name / "tokenizer.json"))
    corpus = CORPUS + special_strings(["<s>", "</s>"]) + ["<unk> and <s> </s><s>"]
    write_json(OUT / f"{name}_cases.json", {
        "reference": f"tokenizers {tokenizers.__version__}: {name}/tokenizer.json",
        "cases": cases_for(tok, corpus, with_bos=True),
        "decode_cases": tok512_decode_cases(tok, sp), "bad_utf8": tok512_bad_utf8(sp)})


def sp_version():
    import sentencepiece
    return sentencepiece.__version__


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer pieces, straight from the regex engine tokenizers uses.
def pretokenize():
    split = lambda regex: pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
    pres = {
        "gpt2": split(GPT2_REGEX),
        "llama3": split(LLAMA3_REGEX),
        "qwen2": split(QWEN2_REGEX),
        "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           split(GPT2_REGEX)]),
    }
    cases = [{"pre_tokenizer": name, "text": text,
              "pieces": [piece for piece, _ in pre.pre_tokenize_str(text)]}
             for name, pre in pres.items() for text in CORPUS if text]
    write_json(OUT / "pretokenize_cases.json", {
        "reference": f"tokenizers {tokenizers.__version__} pre_tokenizers.Split(Regex, isolated)",
        "regexes": {"gpt2": GPT2_REGEX, "llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX},
        "cases": cases})


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    pretokenize()
    tok512()
    tok512_metaspace("first")
    tok512_metaspace("always")
    train_byte_level("bpe_gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    train_byte_level("bpe_llama3", pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=True)
    train_byte_level("bpe_qwen2", pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    train_byte_level("bpe_smollm", pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]))
    smollm2()


if __name__ == "__main__":
    main()
