#!/usr/bin/env python3
"""Reference fixtures for engine/sampling (the outside reference for the logits processors).

Writes tests/data/sampling/processors.json:
  cases: random fp32 logits pushed through Hugging Face transformers' own processors
         (SequenceBiasLogitsProcessor on one-token sequences for OpenAI's logit_bias,
         RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
         TopPLogitsWarper, MinPLogitsWarper), OpenAI presence/frequency penalties in numpy, and
         the whole chain in the order HF generate applies it (the bias first, as vLLM v1 too). Each case stores the input, the
         surviving token ids, their processed logits and the softmax of the result. Cases whose
         top-p / min-p decision lies within 1e-5 of the threshold (where fp32 rounding could
         flip a token) are redrawn, so the surviving set is well defined.
  rng:   the first outputs of xoshiro256** seeded through splitmix64, from the published
         algorithm re-implemented here in Python.
Run anywhere torch and transformers are installed (CPU is enough):
  python3 scripts/make_sampling_fixtures.py
"""
import json
import os

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor,
                                                    SequenceBiasLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "sampling", "processors.json")
MARGIN = 1e-5
MASK64 = (1 << 64) - 1


def openai_penalties(logits, output_tokens, presence, frequency):
    """OpenAI: logit -= presence * (count > 0) + frequency * count, counts over output tokens."""
    counts = np.bincount(np.asarray(output_tokens, dtype=np.int64), minlength=logits.shape[0])
    counts = counts[: logits.shape[0]].astype(np.float32)
    out = logits.copy()
    out -= np.float32(presence) * (counts > 0).astype(np.float32) + np.float32(frequency) * counts
    return out


def top_p_margin_ok(scores, top_p):
    """Every token's mass-above (float64) is at least MARGIN away from top_p."""
    x = scores.astype(np.float64)
    finite = np.isfinite(x)
    p = np.zeros_like(x)
    p[finite] = np.exp(x[finite] - x[finite].max())
    p /= p.sum()
    order = np.argsort(-x, kind="stable")
    above = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
    return bool(np.all(np.abs(above[p[order] > 0] - top_p) > MARGIN))


def min_p_margin_ok(scores, min_p):
    x = scores.astype(np.float64)
    finite = np.isfinite(x)
    p = np.zeros_like(x)
    p[finite] = np.exp(x[finite] - x[finite].max())
    p /= p.sum()
    return bool(np.all(np.abs(p[finite] - min_p * p.max()) > MARGIN * p.max()))


def logit_bias_processor(logit_bias):
    """OpenAI's logit_bias as HF's SequenceBiasLogitsProcessor over one-token sequences (the
    list form; older transformers take only the dict form)."""
    try:
        return SequenceBiasLogitsProcessor(
            sequence_bias=[[[int(t)], float(b)] for t, b in logit_bias])
    except (TypeError, ValueError):
        return SequenceBiasLogitsProcessor(
            sequence_bias={(int(t),): float(b) for t, b in logit_bias})


def run_chain(logits, params, prompt, output):
    """HF processors in generate's order (the sequence bias first, as HF's _get_logits_processor
    and vLLM v1's sampler put it), with the OpenAI penalties after the repetition one.
    Returns the processed fp32 scores, or None when a threshold decision is too close to call."""
    ids = torch.tensor([list(prompt) + list(output)], dtype=torch.long)
    scores = torch.tensor(logits[None, :], dtype=torch.float32)
    if params.get("logit_bias"):
        scores = logit_bias_processor(params["logit_bias"])(ids, scores)
    if params.get("repetition_penalty", 1.0) != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(float(params["repetition_penalty"]))(ids, scores)
    if params.get("presence_penalty", 0.0) or params.get("frequency_penalty", 0.0):
        scores = torch.from_numpy(openai_penalties(scores[0].numpy(), output,
                                                   params.get("presence_penalty", 0.0),
                                                   params.get("frequency_penalty", 0.0)))[None, :]
    if params.get("temperature", 1.0) != 1.0:
        scores = TemperatureLogitsWarper(float(params["temperature"]))(ids, scores)
    if params.get("top_k", 0) > 0:
        scores = TopKLogitsWarper(int(params["top_k"]))(ids, scores)
    if params.get("top_p", 1.0) < 1.0:
        if not top_p_margin_ok(scores[0].numpy(), params["top_p"]):
            return None
        scores = TopPLogitsWarper(float(params["top_p"]))(ids, scores)
    if params.get("min_p", 0.0) > 0.0:
        if not min_p_margin_ok(scores[0].numpy(), params["min_p"]):
            return None
        scores = MinPLogitsWarper(float(params["min_p"]))(ids, scores)
    return scores[0].numpy()


def make_case(rng, name, params, vocab=64, history=True, ties=False, scale=2.0, bias=None):
    """bias: None, or a random logit_bias drawn per attempt (`logit_bias` below): "any" over the
    vocabulary, "seen" with half its ids from the history."""
    for _ in range(1000):
        logits = (rng.standard_normal(vocab) * scale).astype(np.float32)
        if ties:  # few distinct values, so the k-th largest logit is tied
            logits = (np.round(logits) / 2).astype(np.float32)
        prompt = rng.integers(0, vocab, size=12).tolist() if history else []
        output = rng.integers(0, vocab, size=10).tolist() if history else []
        if history:
            output += output[:4]  # repeated tokens, so frequency counts reach 2 and more
            prompt.append(vocab + 3)  # out of the LM head's range: ignored, as HF does
        if bias is not None:
            params = dict(params, logit_bias=logit_bias(rng, vocab, prompt + output
                                                        if bias == "seen" else []))
        processed = run_chain(logits, params, prompt, output)
        if processed is None:
            continue
        kept = np.flatnonzero(np.isfinite(processed))
        probs = torch.softmax(torch.from_numpy(processed).double(), dim=-1).numpy()
        return {
            "name": name,
            "params": params,
            "logits": [float(x) for x in logits],
            "prompt_tokens": prompt,
            "output_tokens": output,
            "kept": kept.tolist(),
            "kept_logits": [float(processed[i]) for i in kept],
            "probs": [float(x) for x in probs],
        }
    raise RuntimeError(f"could not draw a well-conditioned case for {name}")


def cases(rng):
    out = []
    for t in (0.3, 0.7, 1.5):
        out.append(make_case(rng, f"temperature_{t}", {"temperature": t}, history=False))
    for k in (1, 5, 20, 64, 100):
        out.append(make_case(rng, f"top_k_{k}", {"top_k": k}, history=False))
    out.append(make_case(rng, "top_k_ties", {"top_k": 7}, history=False, ties=True))
    for p in (0.3, 0.8, 0.95):
        out.append(make_case(rng, f"top_p_{p}", {"top_p": p}, history=False, scale=0.7))
    for m in (0.1, 0.2, 0.9):
        out.append(make_case(rng, f"min_p_{m}", {"min_p": m}, history=False, scale=0.7))
    for r in (1.3, 0.8, 2.0):
        out.append(make_case(rng, f"repetition_{r}", {"repetition_penalty": r}))
    for pres, freq in ((0.5, 0.0), (0.0, 0.7), (1.2, -0.4), (-1.0, 2.0)):
        out.append(make_case(rng, f"presence_{pres}_frequency_{freq}",
                             {"presence_penalty": pres, "frequency_penalty": freq}))
    for i in range(8):
        params = {
            "repetition_penalty": float(rng.choice([1.0, 1.1, 1.5])),
            "presence_penalty": float(rng.choice([0.0, 0.3])),
            "frequency_penalty": float(rng.choice([0.0, 0.2])),
            "temperature": float(rng.choice([0.5, 0.9, 1.3])),
            "top_k": int(rng.choice([0, 10, 40])),
            "top_p": float(rng.choice([1.0, 0.9, 0.6])),
            "min_p": float(rng.choice([0.0, 0.02, 0.1])),
        }
        out.append(make_case(rng, f"chain_{i}", params, vocab=int(rng.choice([50, 128]))))
    # logit_bias cases come last, so the cases above keep their random draws.
    out.append(make_case(rng, "logit_bias", {}, bias="any"))
    out.append(make_case(rng, "logit_bias_extremes",
                         {"logit_bias": [[3, -100.0], [17, 100.0], [40, -100.0]]}))
    out.append(make_case(rng, "logit_bias_ties", {"logit_bias": [[2, 0.5], [9, -0.5], [33, 1.0]],
                                                  "top_k": 7}, history=False, ties=True))
    for r in (1.5, 0.7):
        out.append(make_case(rng, f"logit_bias_then_repetition_{r}", {"repetition_penalty": r},
                             bias="seen"))
    out.append(make_case(rng, "logit_bias_then_presence_frequency",
                         {"presence_penalty": 0.8, "frequency_penalty": 0.4}, bias="seen"))
    for i in range(6):
        params = {
            "repetition_penalty": float(rng.choice([1.0, 1.3])),
            "presence_penalty": float(rng.choice([0.0, 0.5])),
            "frequency_penalty": float(rng.choice([0.0, 0.3])),
            "temperature": float(rng.choice([0.6, 1.0, 1.4])),
            "top_k": int(rng.choice([0, 10])),
            "top_p": float(rng.choice([1.0, 0.9])),
            "min_p": float(rng.choice([0.0, 0.05])),
        }
        out.append(make_case(rng, f"logit_bias_chain_{i}", params,
                             vocab=int(rng.choice([50, 128])), bias="seen"))
    return out


def logit_bias(rng, vocab, history):
    """A sorted OpenAI logit_bias list [[id, bias], ...] of 8 distinct ids in [0, vocab): biases
    of both signs in [-5, 5] and one -100 (a token all but banned; +100 would leave a one-token
    distribution). Half the ids come from `history` when given (ids < vocab), so that the bias
    and the penalties meet on one token: applying them in the other order gives other logits."""
    seen = sorted({t for t in history if t < vocab})
    ids = set(rng.choice(seen, size=min(4, len(seen)), replace=False).tolist()) if seen else set()
    while len(ids) < 8:
        ids.add(int(rng.integers(0, vocab)))
    biases = [float(np.float32(b)) for b in rng.uniform(-5.0, 5.0, size=7)] + [-100.0]
    rng.shuffle(biases)
    return [[int(t), b] for t, b in zip(sorted(ids), biases)]


def xoshiro256ss(seed, count):
    """xoshiro256** (Blackman & Vigna), state from four splitmix64 outputs."""
    def splitmix(x):
        x = (x + 0x9E3779B97F4A7C15) & MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return x, z ^ (z >> 31)

    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK64

    s = []
    x = seed
    for _ in range(4):
        x, z = splitmix(x)
        s.append(z)
    out = []
    for _ in range(count):
        out.append(rotl((s[1] * 5) & MASK64, 7) * 9 & MASK64)
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
    return out


def main():
    rng = np.random.default_rng(20240611)
    data = {
        "generator": f"scripts/make_sampling_fixtures.py, transformers {transformers.__version__}, "
                     f"torch {torch.__version__}",
        "cases": cases(rng),
        # u64 values as decimal strings (JSON numbers lose precision past 2^53)
        "rng": [{"seed": str(seed), "outputs": [str(v) for v in xoshiro256ss(seed, 8)]}
                for seed in (0, 42, MASK64)],
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(data['cases'])} cases")


if __name__ == "__main__":
    main()
