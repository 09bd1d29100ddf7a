#!/usr/bin/env python3
"""Renders the first turns of MT-bench (../shared/data/prompts/mt_bench.jsonl) with a model's
chat template (transformers + jinja2) into JSONL lines {"text": ...} for `arbor spec-bench`.

  python3 scripts/render_chat_prompts.py --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out /tmp/mt_bench_smollm2.jsonl
"""
import argparse
import json
import os

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models",
                                                   "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "..", "shared", "data", "prompts",
                                                      "mt_bench.jsonl"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", action="store_true",
                    help="only question_id % 5 == 0: the 16 questions the heads never saw "
                         "(scripts/spec_train_common.py holds them out)")
    args = ap.parse_args()
    d, f = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    with open(args.prompts) as src, open(args.out, "w") as dst:
        for line in src:
            q = json.loads(line)
            if args.heldout and q["question_id"] % 5 != 0:
                continue
            text = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}],
                                           add_generation_prompt=True, tokenize=False)
            dst.write(json.dumps({"text": text}) + "\n")


if __name__ == "__main__":
    main()
