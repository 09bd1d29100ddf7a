#!/usr/bin/env python3
"""Reference fixtures for engine/spec (static trees and typical acceptance), from transcriptions
of FasterDecoding/Medusa's medusa/model/utils.py (generate_medusa_buffers, generate_candidates,
evaluate_posterior) in PyTorch.

Writes tests/data/spec/medusa_reference.json:
  buffers: Medusa's buffers for mc_sim_7b_63 (TOPK = 10): tree_indices (the index of each tree
           node's token in cat([root], topk(head 0), ..., topk(head 3))), position ids (depths),
           the attention mask and retrieve_indices (one row per root-to-leaf path, padded).
  typical: cases of typical acceptance on mc_sim_7b_63: the root token, per-head top-10 token
           lists, fp32 logits of the 64 tree nodes (rounded to 3 decimals so both sides read the
           same fp32 values), the temperature; and Medusa's decision: accept_length, the accepted
           path (tree node indices), its tokens, and the next root token (argmax of the logits at
           the last accepted node, Medusa's fast mode).

Medusa pads short retrieve paths with token 0 and the last node's logits, so a padded position
can count as accepted when token 0 is typical at a leaf (a quirk of its implementation, not of
the method). Token 0 is kept improbable (logit -30) and the script checks that masking the padded
positions changes nothing. Cases where any candidate's probability lies within 1e-4 (relative)
of its threshold are redrawn, so fp32 rounding cannot flip a decision.

Run anywhere torch is installed (CPU is enough):
  python3 scripts/make_verifier_fixtures.py
"""
import json
import math
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "spec", "medusa_reference.json")
TOPK = 10
VOCAB = 24
POSTERIOR_THRESHOLD = 0.09  # Medusa's medusa_generate defaults
POSTERIOR_ALPHA = 0.3
MARGIN = 1e-4

MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4],
                [0, 4], [2, 0], [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1],
                [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2],
                [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1],
                [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0],
                [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0],
                [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6],
                [0, 7, 0]]


def pad_path(path, length, pad_value=-2):
    return path + [pad_value] * (length - len(path))


def generate_medusa_buffers(medusa_choices):
    """Transcribed from Medusa (device handling dropped)."""
    sorted_medusa_choices = sorted(medusa_choices, key=lambda x: (len(x), x))
    medusa_len = len(sorted_medusa_choices) + 1
    depth_counts = []
    prev_depth = 0
    for path in sorted_medusa_choices:
        depth = len(path)
        if depth != prev_depth:
            depth_counts.append(0)
        depth_counts[depth - 1] += 1
        prev_depth = depth
    medusa_attn_mask = torch.eye(medusa_len, medusa_len)
    medusa_attn_mask[:, 0] = 1
    start = 0
    for i in range(len(depth_counts)):
        for j in range(depth_counts[i]):
            cur_medusa_choice = sorted_medusa_choices[start + j]
            if len(cur_medusa_choice) == 1:
                continue
            ancestor_idx = []
            for c in range(len(cur_medusa_choice) - 1):
                ancestor_idx.append(sorted_medusa_choices.index(cur_medusa_choice[:c + 1]) + 1)
            medusa_attn_mask[j + start + 1, ancestor_idx] = 1
        start += depth_counts[i]
    medusa_tree_indices = torch.zeros(medusa_len, dtype=torch.long)
    start = 0
    for i in range(len(depth_counts)):
        for j in range(depth_counts[i]):
            cur_medusa_choice = sorted_medusa_choices[start + j]
            medusa_tree_indices[start + j + 1] = cur_medusa_choice[-1] + TOPK * i + 1
        start += depth_counts[i]
    medusa_position_ids = torch.zeros(medusa_len, dtype=torch.long)
    start = 0
    for i in range(len(depth_counts)):
        medusa_position_ids[start + 1: start + depth_counts[i] + 1] = i + 1
        start += depth_counts[i]
    retrieve_indices_nest = []
    retrieve_paths = []
    for i in range(len(sorted_medusa_choices)):
        cur_medusa_choice = sorted_medusa_choices[-i - 1]
        retrieve_indice = []
        if cur_medusa_choice in retrieve_paths:
            continue
        else:
            for c in range(len(cur_medusa_choice)):
                retrieve_indice.append(sorted_medusa_choices.index(cur_medusa_choice[:c + 1]))
                retrieve_paths.append(cur_medusa_choice[:c + 1])
        retrieve_indices_nest.append(retrieve_indice)
    max_length = max([len(x) for x in retrieve_indices_nest])
    retrieve_indices = [pad_path(path, max_length) for path in retrieve_indices_nest]
    retrieve_indices = torch.tensor(retrieve_indices, dtype=torch.long)
    retrieve_indices = retrieve_indices + 1
    retrieve_indices = torch.cat(
        [torch.zeros((retrieve_indices.shape[0], 1), dtype=torch.long), retrieve_indices], dim=1)
    return {
        "medusa_attn_mask": medusa_attn_mask,
        "tree_indices": medusa_tree_indices,
        "medusa_position_ids": medusa_position_ids,
        "retrieve_indices": retrieve_indices,
    }


def generate_candidates(root_token, topk_tokens, tree_indices, retrieve_indices):
    """Medusa's generate_candidates with the root and the heads' top-k already chosen."""
    candidates = torch.cat([torch.tensor([root_token]), topk_tokens.view(-1)], dim=-1)
    tree_candidates = candidates[tree_indices]
    tree_candidates_ext = torch.cat([tree_candidates, torch.zeros((1), dtype=torch.long)], dim=0)
    cart_candidates = tree_candidates_ext[retrieve_indices]
    return cart_candidates, tree_candidates


def evaluate_posterior_typical(logits, candidates, temperature, posterior_threshold,
                               posterior_alpha, valid=None):
    """Medusa's evaluate_posterior, typical branch. `valid` (optional) masks padded positions."""
    posterior_prob = torch.softmax(logits[:, :-1] / temperature, dim=-1)
    candidates_prob = torch.gather(
        posterior_prob, dim=-1, index=candidates[:, 1:].unsqueeze(-1)).squeeze(-1)
    posterior_entropy = -torch.sum(posterior_prob * torch.log(posterior_prob + 1e-5), dim=-1)
    threshold = torch.minimum(
        torch.ones_like(posterior_entropy) * posterior_threshold,
        torch.exp(-posterior_entropy) * posterior_alpha,
    )
    posterior_mask = candidates_prob > threshold
    if valid is not None:
        posterior_mask = posterior_mask & valid
    candidates_accept_length = (torch.cumprod(posterior_mask, dim=1)).sum(dim=1)
    accept_length = candidates_accept_length.max()
    if accept_length == 0:
        best_candidate = torch.tensor(0, dtype=torch.long)
    else:
        best_candidates = torch.where(candidates_accept_length == accept_length)[0]
        likelihood = torch.sum(torch.log(candidates_prob[best_candidates, :accept_length]), dim=-1)
        best_candidate = best_candidates[torch.argmax(likelihood)]
    margin = ((candidates_prob - threshold).abs() / threshold).min().item()
    return int(best_candidate), int(accept_length), margin


def make_case(gen, buffers, temperature, favour, rank_p, root_off):
    tree_indices = buffers["tree_indices"]
    retrieve = buffers["retrieve_indices"]
    depth = buffers["medusa_position_ids"]
    # Four heads' top-10 lists of distinct tokens, never token 0 (see the module docstring).
    topk = torch.stack([torch.randperm(VOCAB - 1, generator=gen)[:TOPK] + 1 for _ in range(4)])
    root = int(torch.randint(1, VOCAB, (1,), generator=gen))
    nodes = tree_indices.shape[0]
    logits = torch.randn(nodes, VOCAB, generator=gen) * 1.5
    for n in range(nodes):
        d = int(depth[n])
        if d < 4 and torch.rand(1, generator=gen).item() < favour:
            # Favour one of the next head's candidates, low ranks most often.
            u = torch.rand(1, generator=gen).item()
            r = min(int(math.log(1.0 - u) / math.log(1.0 - rank_p)), TOPK - 1)  # geometric
            logits[n, topk[d, r]] += 2.0 + 4.0 * torch.rand(1, generator=gen).item()
    if root_off:  # the root's favourite is no head-1 candidate: nothing is accepted
        off = [t for t in range(1, VOCAB) if t not in topk[0].tolist()]
        logits[0, off[int(torch.randint(len(off), (1,), generator=gen))]] += 8.0
    logits[:, 0] = -30.0
    rounded = [[round(float(v), 3) for v in row] for row in logits]
    logits = torch.tensor(rounded, dtype=torch.float32)

    cart_candidates, _ = generate_candidates(root, topk, tree_indices, retrieve)
    path_logits = logits[retrieve]  # Medusa's tree_decoding reorder
    best, accept_length, margin = evaluate_posterior_typical(
        path_logits, cart_candidates, temperature, POSTERIOR_THRESHOLD, POSTERIOR_ALPHA)
    valid = (retrieve[:, 1:] > 0)
    best_masked, accept_masked, _ = evaluate_posterior_typical(
        path_logits, cart_candidates, temperature, POSTERIOR_THRESHOLD, POSTERIOR_ALPHA, valid)
    assert (best, accept_length) == (best_masked, accept_masked), "padding quirk hit"
    if margin < MARGIN:
        return None
    accepted_nodes = [int(v) for v in retrieve[best, :accept_length + 1]]
    accepted_tokens = [int(v) for v in cart_candidates[best, 1:accept_length + 1]]
    next_root = int(torch.argmax(path_logits[best, accept_length]))
    return {
        "temperature": temperature,
        "root_token": root,
        "topk": topk.tolist(),
        "logits": rounded,
        "accept_length": accept_length,
        "accepted_nodes": accepted_nodes,
        "accepted_tokens": accepted_tokens,
        "bonus_token": next_root,
    }


def main():
    buffers = generate_medusa_buffers(MC_SIM_7B_63)
    gen = torch.Generator().manual_seed(20240611)
    cases = []
    # (temperature, probability that a node favours one of its children's tokens, the geometric
    # parameter of the favoured rank, whether the root favours a non-candidate)
    settings = [(0.5, 0.8, 0.45, False), (0.7, 0.95, 0.45, False), (0.7, 0.5, 0.45, False),
                (1.0, 0.8, 0.45, False), (1.0, 1.0, 0.9, False), (1.0, 0.2, 0.45, False),
                (1.3, 0.9, 0.45, False), (2.0, 0.9, 0.45, False), (0.5, 1.0, 0.95, False),
                (0.5, 0.8, 0.45, True), (0.7, 1.0, 0.3, False), (1.0, 0.6, 0.45, False)]
    for setting in settings:
        case = None
        while case is None:
            case = make_case(gen, buffers, *setting)
        cases.append(case)
    lengths = [c["accept_length"] for c in cases]
    assert set(lengths) >= {0, 1, 2, 3, 4}, f"accept lengths not varied enough: {lengths}"
    doc = {
        "source": "scripts/make_verifier_fixtures.py (Medusa utils.py transcription)",
        "top_k": TOPK,
        "vocab": VOCAB,
        "posterior_threshold": POSTERIOR_THRESHOLD,
        "posterior_alpha": POSTERIOR_ALPHA,
        "buffers": {
            "tree_indices": buffers["tree_indices"].tolist(),
            "position_ids": buffers["medusa_position_ids"].tolist(),
            "attn_mask": buffers["medusa_attn_mask"].to(torch.int64).tolist(),
            "retrieve_indices": buffers["retrieve_indices"].tolist(),
        },
        "typical": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {OUT}: {len(cases)} typical cases, accept lengths {lengths}")


if __name__ == "__main__":
    main()
