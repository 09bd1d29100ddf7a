#!/usr/bin/env python3
"""PyTorch reference for the speculative-decoding heads, and the fixture writer for the C++
proposer tests (tests/unit/*proposer*_test.cc).

The modules below are transcribed from the official code, keeping its structure and arithmetic:
- Medusa (FasterDecoding/Medusa, medusa/model/medusa_model.py): ResBlock x + SiLU(W x + b),
  head = ResBlock^L then a bias-free LM head; candidates as utils.generate_medusa_buffers /
  generate_candidates (TOPK = 10; node with path [r1..rd] gets rank rd of head d).
- EAGLE-1/2 (SafeAILab/EAGLE, eagle/model/cnets1.py Model): fc over concat(embed(token_{t+1}),
  feature_t), one Llama decoder layer without input_layernorm, the target's LM head, and the
  EAGLE-2 dynamic tree of topK_genrate.
- EAGLE-3 (eagle/model/cnets.py Model): fc [h, 3h] over the target's low/mid/high residual
  stream, midlayer whose q/k/v read concat(input_layernorm(emb), hidden_norm(h)), own norm +
  lm_head over the draft vocabulary, d2t (target id = draft id + d2t[draft id]), and the same
  topK_genrate.

It writes random-weight head checkpoints in the official formats for two targets,
tests/data/models/llama_gqa (hidden 64, vocab 320, 2 layers) and stories260K (hidden 64, vocab
512, 5 layers, from ../shared), and the reference outputs (head logits, per-depth top-k, draft
logits of every committed row, the draft trees of two successive rounds) as JSON. Seeds are
chosen so that every ranking decision has a margin of at least MIN_GAP (the C++ float32
arithmetic differs by ~1e-6), so the expected trees are exact.

EAGLE-3 capture layers: the official code (modeling_llama_kv.py) takes the residual stream at the
input of layers 2, L // 2 and L - 3, which collide for L < 7. For such tiny models this project
uses (0, 1, 2) for L = 2, (0, 1, 3) for L = 3 and (1, L // 2, L - 1) for 4 <= L <= 6, where index L
means the residual stream after the last layer (before the final norm). A draft config may
override them with "eagle_config": {"eagle_aux_hidden_state_layer_ids": [...]} (vLLM's key).
The C++ side (engine/draft/eagle_checkpoint.h, eagle3_capture_layers) uses the same rule.

Usage:
  python3 scripts/spec_heads_reference.py [--shared ../shared] [--out tests/data/spec/random]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TOPK = 10  # Medusa's candidates per head (medusa/model/utils.py)
MIN_GAP = 1e-4  # smallest allowed gap between consecutive ranked scores in a fixture


# ---------------------------------------------------------------------------------------------
# Capture layers for EAGLE-3 (see the module docstring)
# ---------------------------------------------------------------------------------------------
def eagle3_capture_layers(num_layers):
    L = num_layers
    if L >= 7:
        return [2, L // 2, L - 3]
    if L <= 1:
        return [0, 0, L]
    if L == 2:
        return [0, 1, 2]
    if L == 3:
        return [0, 1, 3]
    return [1, L // 2, L - 1]


# ---------------------------------------------------------------------------------------------
# Medusa (medusa_model.py)
# ---------------------------------------------------------------------------------------------
class ResBlock(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def medusa_heads(hidden, vocab, num_heads, num_layers, own_lm_head):
    """nn.ModuleList as MedusaModelABC builds it; without own_lm_head the last Linear is left out
    (Medusa-2 style heads that use the base LM head)."""
    heads = []
    for _ in range(num_heads):
        mods = [ResBlock(hidden) for _ in range(num_layers)]
        if own_lm_head:
            mods.append(nn.Linear(hidden, vocab, bias=False))
        heads.append(nn.Sequential(*mods))
    return nn.ModuleList(heads)


def medusa_tree_buffers(choices):
    """(sorted choices, tree_indices) as generate_medusa_buffers computes them."""
    sorted_choices = sorted(choices, key=lambda x: (len(x), x))
    depth_counts = []
    prev_depth = 0
    for path in sorted_choices:
        if len(path) != prev_depth:
            depth_counts.append(0)
        depth_counts[len(path) - 1] += 1
        prev_depth = len(path)
    tree_indices = [0] * (len(sorted_choices) + 1)
    start = 0
    for i in range(len(depth_counts)):
        for j in range(depth_counts[i]):
            tree_indices[start + j + 1] = sorted_choices[start + j][-1] + TOPK * i + 1
        start += depth_counts[i]
    return sorted_choices, tree_indices


def medusa_candidates(medusa_logits, root_token, tree_indices):
    """generate_candidates for greedy: [root, top-TOPK of head 0, of head 1, ...][tree_indices]."""
    topk = torch.topk(medusa_logits, TOPK, dim=-1).indices  # [heads, TOPK]
    candidates = torch.cat([torch.tensor([root_token]), topk.view(-1)])
    return candidates[torch.tensor(tree_indices)].tolist(), topk.tolist()


def tree_parents_from_sorted_choices(sorted_choices):
    parents = [-1]
    for path in sorted_choices:
        parents.append(0 if len(path) == 1 else sorted_choices.index(path[:-1]) + 1)
    return parents


# ---------------------------------------------------------------------------------------------
# EAGLE draft layers (cnets1.py / cnets.py), fp32, no pretraining_tp, no rope scaling
# ---------------------------------------------------------------------------------------------
def _make_causal_mask(input_ids_shape, dtype, device, past_key_values_length=0):
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)
    if past_key_values_length > 0:
        mask = torch.cat([torch.zeros(tgt_len, past_key_values_length, dtype=dtype, device=device),
                          mask], dim=-1)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len + past_key_values_length)


def _expand_mask(mask, dtype, tgt_len=None):
    bsz, src_len = mask.size()
    tgt_len = tgt_len if tgt_len is not None else src_len
    expanded_mask = mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)
    inverted_mask = 1.0 - expanded_mask
    return inverted_mask.masked_fill(inverted_mask.to(torch.bool), torch.finfo(dtype).min)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen,
                                                           head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
    cos = cos.squeeze(1).squeeze(0)
    sin = sin.squeeze(1).squeeze(0)
    cos = cos[position_ids].unsqueeze(1)
    sin = sin[position_ids].unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, max_position_embeddings=2048, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        t = torch.arange(max_position_embeddings, dtype=inv_freq.dtype)
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos_cached = emb.cos()[None, None, :, :]
        self.sin_cached = emb.sin()[None, None, :, :]

    def forward(self, x, seq_len=None):
        return self.cos_cached[:, :, :seq_len], self.sin_cached[:, :, :seq_len]


class LlamaAttention(nn.Module):
    def __init__(self, c, in_mult=1):
        super().__init__()
        self.hidden_size = c["hidden_size"]
        self.num_heads = c["num_attention_heads"]
        self.head_dim = self.hidden_size // self.num_heads
        self.num_key_value_heads = c["num_key_value_heads"]
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        bias = bool(c.get("qkv_bias", False))
        d_in = self.hidden_size * in_mult
        self.q_proj = nn.Linear(d_in, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_in, self.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_in, self.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(self.head_dim, c["max_position_embeddings"],
                                               c.get("rope_theta", 10000.0))

    def forward(self, hidden_states, attention_mask, position_ids, past_key_value):
        bsz, q_len, _ = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, self.num_key_value_heads,
                                            self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, self.num_key_value_heads,
                                            self.head_dim).transpose(1, 2)
        kv_seq_len = k.shape[-2]
        if past_key_value is not None:
            kv_seq_len += past_key_value[0].shape[-2]
        cos, sin = self.rotary_emb(v, seq_len=kv_seq_len)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, position_ids)
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        present = (k, v)
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            w = w + attention_mask
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        out = torch.matmul(w, v).transpose(1, 2).reshape(bsz, q_len, self.hidden_size)
        return self.o_proj(out), present


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class LlamaDecoderLayer(nn.Module):
    """cnets1.py: layer index 0 has no input_layernorm."""

    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden_size"], eps=c["rms_norm_eps"])

    def forward(self, hidden_states, attention_mask, position_ids, past_key_value):
        residual = hidden_states
        hidden_states, present = self.self_attn(hidden_states, attention_mask, position_ids,
                                                past_key_value)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = residual + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, present


class LlamaDecoderLayeremb(nn.Module):
    """cnets.py (EAGLE-3) midlayer."""

    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c, in_mult=2)
        self.mlp = LlamaMLP(c)
        eps = c["rms_norm_eps"]
        self.hidden_norm = LlamaRMSNorm(c["hidden_size"], eps=eps)
        self.input_layernorm = LlamaRMSNorm(c["hidden_size"], eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden_size"], eps=eps)

    def forward(self, input_emb, hidden_states, attention_mask, position_ids, past_key_value):
        residual = hidden_states
        hidden_states = self.hidden_norm(hidden_states)
        input_emb = self.input_layernorm(input_emb)
        hidden_states = torch.cat((input_emb, hidden_states), dim=-1)
        hidden_states, present = self.self_attn(hidden_states, attention_mask, position_ids,
                                                past_key_value)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = residual + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, present


class EagleModel(nn.Module):
    """cnets1.Model (eagle3=False) or cnets.Model (eagle3=True): forward + topK_genrate."""

    def __init__(self, c, eagle3, embed_weight, total_tokens=63, depth=5, top_k=8):
        super().__init__()
        self.c = c
        self.eagle3 = eagle3
        h = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        self.embed_tokens.weight.data = embed_weight.clone()
        if eagle3:
            self.midlayer = LlamaDecoderLayeremb(c)
            self.fc = nn.Linear(3 * h, h, bias=False)
            self.norm = LlamaRMSNorm(h, eps=c["rms_norm_eps"])
            self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)
            self.register_buffer("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.long))
        else:
            self.layers = nn.ModuleList([LlamaDecoderLayer(c)])
            self.fc = nn.Linear(2 * h, h, bias=c.get("bias", True))
        self.top_k = top_k
        self.total_tokens = total_tokens - 1
        self.depth = depth
        self.tree_mask_init = torch.eye(top_k)[None, None]
        self.position_ids = torch.zeros(top_k, dtype=torch.long)
        self.stable_kv = None
        self.tree_mask = None
        self.trace = []  # (what, tensor) of every ranking decision, for the margin check

    def head_logits(self, hidden, target_head):
        if self.eagle3:
            return self.lm_head(self.norm(hidden))
        return target_head(hidden)

    def to_target(self, ids):
        if self.eagle3 and self.c["draft_vocab_size"] != self.c["vocab_size"]:
            return ids + self.d2t[ids]
        return ids

    def _prepare_decoder_attention_mask(self, attention_mask, input_shape, inputs_embeds,
                                        past_key_values_length):
        combined = None
        if input_shape[-1] > 1:
            combined = _make_causal_mask(input_shape, torch.float32, inputs_embeds.device,
                                         past_key_values_length)
        if attention_mask is not None:
            expanded = _expand_mask(attention_mask, torch.float32, tgt_len=input_shape[-1])
            combined = expanded if combined is None else expanded + combined
        if self.tree_mask is not None:
            tree_mask = self.tree_mask
            _, _, s0, s1 = tree_mask.shape
            combined[:, :, -s0:, -s1:][tree_mask == 0] = torch.finfo(torch.float32).min
        return combined

    def forward(self, hidden_states, input_ids, position_ids=None, past_key_values=None):
        batch_size, seq_length, _ = hidden_states.shape
        inputs_embeds = self.embed_tokens(input_ids)
        past_len = 0
        if past_key_values is not None:
            past_len = past_key_values[0][0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(past_len, seq_length + past_len).unsqueeze(0).view(-1,
                                                                                        seq_length)
        else:
            position_ids = position_ids.view(-1, seq_length).long()
        attention_mask = torch.ones((batch_size, seq_length + past_len), dtype=torch.bool)
        attention_mask = self._prepare_decoder_attention_mask(attention_mask,
                                                              (batch_size, seq_length),
                                                              hidden_states, past_len)
        past = past_key_values[0] if past_key_values is not None else None
        if self.eagle3:
            if hidden_states.shape[-1] != inputs_embeds.shape[-1]:
                hidden_states = self.fc(hidden_states)
            hidden_states, present = self.midlayer(inputs_embeds, hidden_states, attention_mask,
                                                   position_ids, past)
        else:
            hidden_states = self.fc(torch.cat((inputs_embeds, hidden_states), dim=-1))
            hidden_states, present = self.layers[0](hidden_states, attention_mask, position_ids,
                                                    past)
        return hidden_states, (present,)

    @torch.no_grad()
    def topK_genrate(self, hidden_states, input_ids, head):
        """The official EAGLE-2 tree growth; returns (tokens, parents) plus the committed rows'
        draft logits (all rows of this call's committed forward)."""
        total_tokens, depth, top_k = self.total_tokens, self.depth, self.top_k
        sample_token = input_ids[:, -1]
        scores_list, parents_list, ss_token = [], [], []
        input_ids = input_ids[:, 1:]
        len_posi = input_ids.shape[1]
        self.tree_mask = None
        if self.stable_kv is not None:
            kv_len = self.stable_kv[0][0].shape[2]
            out_hidden, past_key_values = self(hidden_states, input_ids=input_ids[:, kv_len:],
                                               past_key_values=self.stable_kv)
        else:
            out_hidden, past_key_values = self(hidden_states, input_ids=input_ids)
        self.stable_kv = past_key_values
        committed_logits = self.head_logits(out_hidden[0], head)
        last_hidden = out_hidden[:, -1]
        last_p = F.log_softmax(self.head_logits(last_hidden, head), dim=-1)
        self.trace.append(("rank", last_p[0], top_k))
        top = torch.topk(last_p, top_k, dim=-1)
        topk_index, topk_p = top.indices, top.values
        scores = topk_p[0]
        scores_list.append(scores[None])
        parents_list.append(torch.zeros(1, dtype=torch.long))
        ss_token.append(self.to_target(topk_index))
        input_ids = self.to_target(topk_index)
        input_hidden = last_hidden[None].repeat(1, top_k, 1)
        tree_mask = self.tree_mask_init
        topk_cs_index = torch.arange(top_k)
        for i in range(depth):
            self.tree_mask = tree_mask
            position_ids = len_posi + self.position_ids
            out_hidden, past_key_values = self(input_hidden, input_ids=input_ids,
                                               past_key_values=past_key_values,
                                               position_ids=position_ids)
            len_posi += 1
            bias1 = top_k if i > 0 else 0
            bias2 = max(0, i - 1)
            bias = 1 + top_k ** 2 * bias2 + bias1
            parents_list.append(topk_cs_index + bias)
            last_p = F.log_softmax(self.head_logits(out_hidden[0], head), dim=-1)
            for row in last_p:
                self.trace.append(("rank", row, top_k))
            top = torch.topk(last_p, top_k, dim=-1)
            topk_index, topk_p = top.indices, top.values
            cu_scores = topk_p + scores[:, None]
            self.trace.append(("rank", cu_scores.view(-1), top_k))
            topk_cs = torch.topk(cu_scores.view(-1), top_k, dim=-1)
            topk_cs_index, topk_cs_p = topk_cs.indices, topk_cs.values
            scores = topk_cs_p
            out_ids = topk_cs_index // top_k
            input_hidden = out_hidden[:, out_ids]
            input_ids = topk_index.view(-1)[topk_cs_index][None]
            input_ids = self.to_target(input_ids)
            ss_token.append(self.to_target(topk_index))
            scores_list.append(cu_scores)
            tree_mask = torch.cat((tree_mask[:, :, out_ids], self.tree_mask_init), dim=3)
        scores_list = torch.cat(scores_list, dim=0).view(-1)
        ss_token_list = torch.cat(ss_token, dim=0).view(-1)
        self.trace.append(("select", scores_list, total_tokens))
        top_scores = torch.topk(scores_list, total_tokens, dim=-1)
        top_scores_index = torch.sort(top_scores.indices).values
        draft_tokens = ss_token_list[top_scores_index]
        draft_tokens = torch.cat((sample_token, draft_tokens), dim=0)
        draft_parents = torch.cat(parents_list, dim=0)[top_scores_index // top_k].long()
        mask_index = torch.searchsorted(top_scores_index, draft_parents - 1, right=False)
        mask_index[draft_parents == 0] = -1
        mask_index = mask_index + 1
        # Node i + 1's parent is mask_index[i] (0 = the root); check it really was selected.
        parents = [-1] + mask_index.tolist()
        for i in range(total_tokens):
            if draft_parents[i] != 0:
                assert top_scores_index[mask_index[i] - 1] == draft_parents[i] - 1
        return draft_tokens.tolist(), parents, committed_logits


def min_gap(trace):
    """Smallest margin of any ranking decision recorded in an EagleModel trace."""
    worst = float("inf")
    for item in trace:
        if item[0] == "rank":  # the order of the best k and the k-th / (k+1)-th boundary
            v = torch.sort(item[1], descending=True).values
            k = min(v.numel() - 1, item[2])
            worst = min(worst, float((v[:k] - v[1:k + 1]).min()))
        else:
            v = torch.sort(item[1], descending=True).values
            n = item[2]
            if n < v.numel():
                worst = min(worst, float(v[n - 1] - v[n]))
    return worst


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------
def load_target(name, shared):
    from transformers import AutoModelForCausalLM
    if name == "stories260K":
        from make_golden_fixtures import load_llama2c_as_hf
        model = load_llama2c_as_hf(os.path.join(shared, "models", "stories260K", "stories260K.bin"))
    else:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.join(ROOT, "tests", "data", "models", name), dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def target_features(model, ids, capture):
    """Final-norm hidden [n, h] and the residual stream at the input of each `capture` layer
    ([n, h] each; index L = the input of the final norm), via forward hooks."""
    inputs = {}
    hooks = []
    layers = model.model.layers
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: inputs.__setitem__(i, (args[0] if args else
                                                                 kwargs["hidden_states"]).clone()),
            with_kwargs=True))
    hooks.append(model.model.norm.register_forward_pre_hook(
        lambda m, args: inputs.__setitem__(len(layers), args[0].clone())))
    out = model.model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    final = out.last_hidden_state[0]
    return final, [inputs[c][0] for c in capture]


@torch.no_grad()
def target_greedy_next(model, ids):
    return int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())


# ---------------------------------------------------------------------------------------------
# Fixture writing
# ---------------------------------------------------------------------------------------------
def f32_list(t):
    return [float(f"{np.float32(x):.9g}") for x in t.reshape(-1).tolist()]


def rows(t):
    return [f32_list(r) for r in t]


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")


def random_linear_(lin, gen, scale=1.0):
    fan_in = lin.weight.shape[1]
    lin.weight.data = torch.randn(lin.weight.shape, generator=gen) * (scale / math.sqrt(fan_in))
    if lin.bias is not None:
        lin.bias.data = torch.randn(lin.bias.shape, generator=gen) * 0.1


def random_norm_(norm, gen):
    norm.weight.data = 1.0 + 0.2 * torch.randn(norm.weight.shape, generator=gen)


def make_medusa(out_dir, target_name, target, shared_ok, seed, num_heads, num_layers, own_lm_head,
                trees):
    cfg = target.config
    h, V = cfg.hidden_size, cfg.vocab_size
    rng = np.random.default_rng(seed)
    ids = [1] + [int(x) for x in rng.integers(3, V, size=11)]
    final, _ = target_features(target, ids, [])
    root = target_greedy_next(target, ids)
    hidden = final[-1]
    for attempt in range(50):
        gen = torch.Generator().manual_seed(seed * 100 + attempt)
        heads = medusa_heads(h, V, num_heads, num_layers, own_lm_head)
        for head in heads:
            for m in head:
                if isinstance(m, ResBlock):
                    random_linear_(m.linear, gen, scale=1.0)
                else:
                    random_linear_(m, gen, scale=3.0)
        with torch.no_grad():
            if own_lm_head:
                logits = torch.stack([heads[i](hidden) for i in range(num_heads)])
            else:
                logits = torch.stack([target.lm_head(heads[i](hidden)) for i in range(num_heads)])
        v = torch.sort(logits, dim=-1, descending=True).values[:, :TOPK + 1]
        gap = float((v[:, :-1] - v[:, 1:]).min())
        if gap > MIN_GAP * float(logits.abs().max()):
            break
    else:
        raise RuntimeError("no Medusa seed with clear top-k margins")
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().contiguous() for k, v in heads.state_dict().items()}
    save_file(sd, os.path.join(out_dir, "medusa_lm_head.safetensors"))
    write_json(os.path.join(out_dir, "config.json"),
               {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
                "base_model_name_or_path": target_name})
    tree_out = []
    for name, choices in trees:
        sorted_choices, tree_indices = medusa_tree_buffers(choices)
        tokens, _ = medusa_candidates(logits, root, tree_indices)
        tree_out.append({"name": name, "choices": choices, "tokens": tokens,
                         "parents": tree_parents_from_sorted_choices(sorted_choices)})
    write_json(os.path.join(out_dir, "reference.json"), {
        "generator": "scripts/spec_heads_reference.py (Medusa medusa_model.py ResBlock heads)",
        "target": target_name, "tokens": ids, "root": root,
        "hidden": f32_list(hidden), "head_logits": rows(logits),
        "topk": torch.topk(logits, TOPK, dim=-1).indices.tolist(), "trees": tree_out,
        "min_gap": gap})
    print(f"{out_dir}: {num_heads} heads x {num_layers} layers, own lm_head {own_lm_head}, "
          f"top-k gap {gap:.3g}")


def eagle_config(target, eagle3, bias, draft_vocab=None, heads=None, kv_heads=None, inter=None):
    c = target.config
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": c.hidden_size, "intermediate_size": inter or c.intermediate_size,
           "num_attention_heads": heads or c.num_attention_heads,
           "num_key_value_heads": kv_heads or c.num_key_value_heads,
           "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 2048, "vocab_size": c.vocab_size,
           "bias": bias, "torch_dtype": "float32"}
    if eagle3:
        cfg["draft_vocab_size"] = draft_vocab or c.vocab_size
    return cfg


def randomize_eagle(model, gen, out_scale):
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            scale = 3.0 if name == "lm_head" else 1.0
            if name.endswith(("o_proj", "down_proj")):
                scale = out_scale  # larger draft hidden states: peakier draft distributions
            random_linear_(mod, gen, scale=scale)
        elif isinstance(mod, LlamaRMSNorm):
            random_norm_(mod, gen)


def eagle_state_dict(model, eagle3, own_embed):
    sd = {}
    for k, v in model.state_dict().items():
        if k.startswith("embed_tokens.") and not own_embed:
            continue
        if k == "d2t" and model.c["draft_vocab_size"] == model.c["vocab_size"]:
            continue
        sd[k] = v.detach().contiguous()
    if eagle3 and "d2t" in sd:
        t2d = torch.zeros(model.c["vocab_size"], dtype=torch.bool)
        ids = torch.arange(model.c["draft_vocab_size"]) + sd["d2t"]
        t2d[ids] = True
        sd["t2d"] = t2d
    return sd


def make_eagle(out_dir, target_name, target, seed, eagle3, bias, own_embed=False,
               draft_vocab=None, params=((60, 5, 10), (16, 3, 4), (8, 1, 10)), arch=None,
               out_scale=1.0):
    c = target.config
    arch = arch or {}
    cfg = eagle_config(target, eagle3, bias, draft_vocab, **arch)
    capture = eagle3_capture_layers(c.num_hidden_layers) if eagle3 else []
    rng = np.random.default_rng(seed)
    prompt = [1] + [int(x) for x in rng.integers(3, c.vocab_size, size=9)]
    n = len(prompt)
    head = target.lm_head
    for attempt in range(200):
        gen = torch.Generator().manual_seed(seed * 1000 + attempt)
        embed = (torch.randn(c.vocab_size, c.hidden_size, generator=gen) * 0.5 if own_embed
                 else target.model.embed_tokens.weight.detach())
        models = []
        for (tt, dp, tk) in params:
            m = EagleModel(cfg, eagle3, embed, total_tokens=tt, depth=dp, top_k=tk).eval()
            models.append(m)
        g2 = torch.Generator().manual_seed(seed * 1000 + attempt)
        randomize_eagle(models[0], g2, out_scale)
        if eagle3 and cfg["draft_vocab_size"] != cfg["vocab_size"]:
            used = torch.sort(torch.randperm(c.vocab_size, generator=g2)[:cfg["draft_vocab_size"]]
                              ).values
            models[0].d2t.copy_(used - torch.arange(cfg["draft_vocab_size"]))
        for m in models[1:]:
            m.load_state_dict(models[0].state_dict())

        def feats(ids):
            final, cap = target_features(target, ids, capture)
            return torch.cat(cap, dim=-1) if eagle3 else final

        # Round 1: the prompt's features, root = the target's greedy next token.
        root = target_greedy_next(target, prompt)
        f1 = feats(prompt)
        results = []
        with torch.no_grad():
            for m in models:
                tokens, parents, logits = m.topK_genrate(f1[None], torch.tensor([prompt + [root]]),
                                                         head)
                results.append([(tokens, parents, logits)])
        # Round 2: accept the first child chain of length 2 of the first tree, then a bonus token.
        tokens0, parents0 = results[0][0][0], results[0][0][1]
        first = parents0.index(0)
        second = parents0.index(first)
        accepted = [root, tokens0[first], tokens0[second]]
        seq = prompt + accepted
        bonus = target_greedy_next(target, seq)
        f2 = feats(seq)[n:]
        with torch.no_grad():
            for m, r in zip(models, results):
                tokens, parents, logits = m.topK_genrate(f2[None], torch.tensor([seq + [bonus]]),
                                                         head)
                r.append((tokens, parents, logits))
        gap = min(min_gap(m.trace) for m in models)
        if gap > MIN_GAP:
            break
    else:
        raise RuntimeError("no EAGLE seed with clear ranking margins")
    os.makedirs(out_dir, exist_ok=True)
    save_file(eagle_state_dict(models[0], eagle3, own_embed),
              os.path.join(out_dir, "model.safetensors"))
    write_json(os.path.join(out_dir, "config.json"), cfg)

    def capture_rows(ids, start):
        final, cap = target_features(target, ids, capture)
        if eagle3:
            return {"captured": [rows(x[start:]) for x in cap]}
        return {"hidden": rows(final[start:])}

    rounds = [dict(start=0, tokens=prompt, next_token=root, **capture_rows(prompt, 0)),
              dict(start=n, tokens=accepted, next_token=bonus, **capture_rows(seq, n))]
    for ri, rd in enumerate(rounds):
        rd["draft_logits"] = rows(results[0][ri][2])
        rd["trees"] = [{"total_tokens": p[0], "depth": p[1], "top_k": p[2],
                        "tokens": r[ri][0], "parents": r[ri][1]}
                       for p, r in zip(params, results)]
    write_json(os.path.join(out_dir, "reference.json"), {
        "generator": "scripts/spec_heads_reference.py (EAGLE " +
                     ("cnets.py EAGLE-3" if eagle3 else "cnets1.py EAGLE-1/2") + " topK_genrate)",
        "target": target_name, "capture_layers": capture, "rounds": rounds, "min_gap": gap})
    print(f"{out_dir}: eagle3={eagle3} bias={bias} own_embed={own_embed} attempts={attempt + 1} "
          f"min gap {gap:.3g}, tree sizes {[len(r[0][0]) for r in results]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "spec", "random"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gqa = load_target("llama_gqa", args.shared)
    stories = load_target("stories260K", args.shared)
    mc_sim_7b_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4],
                    [0, 4], [2, 0], [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1],
                    [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2],
                    [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1],
                    [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0],
                    [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0],
                    [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
                    [1, 6], [0, 7, 0]]
    small = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [9], [0, 0, 9]]
    out = args.out
    make_medusa(os.path.join(out, "medusa_llama_gqa"), "llama_gqa", gqa, True, seed=3,
                num_heads=4, num_layers=1, own_lm_head=True,
                trees=[("mc_sim_7b_63", mc_sim_7b_63), ("small", small)])
    make_medusa(os.path.join(out, "medusa_stories260K"), "stories260K", stories, True, seed=4,
                num_heads=3, num_layers=2, own_lm_head=False, trees=[("small", small)])
    make_eagle(os.path.join(out, "eagle_llama_gqa"), "llama_gqa", gqa, seed=5, eagle3=False,
               bias=True, out_scale=2.0)
    make_eagle(os.path.join(out, "eagle_stories260K"), "stories260K", stories, seed=6,
               eagle3=False, bias=False, own_embed=True)
    make_eagle(os.path.join(out, "eagle3_llama_gqa"), "llama_gqa", gqa, seed=7, eagle3=True,
               bias=False, draft_vocab=200)
    make_eagle(os.path.join(out, "eagle3_stories260K"), "stories260K", stories, seed=8,
               eagle3=True, bias=False, arch={"heads": 4, "kv_heads": 1, "inter": 128})


if __name__ == "__main__":
    main()
