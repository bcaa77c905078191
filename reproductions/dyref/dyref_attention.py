"""Do DyReF's queries look at the answer? A quantitative version of the paper's Fig. 3 (§7.2).

For each of the first --n questions of a SQuAD file, the queries' attention (max over layers and
heads, as `posbias explain attention` draws it) is read over the context tokens of the window that
holds the predicted answer, and compared with the first gold answer's tokens:
  in-span hit   the query's most-attended context token lies inside the gold answer
  boundary hit  the start query's top token is the answer's first token (end query: its last)
  near hit      the top token lies within 3 tokens of the answer span (or inside it)
  lift          mean attention on the answer tokens / mean attention on all context tokens
Chance levels (|answer| / |context| and 1 / |context|) are printed beside each hit rate. Questions
whose gold answer is not in that window are counted and skipped.

  .venv/bin/python reproductions/dyref/dyref_attention.py \
      --model runs/experiments/dyref_fewshot/runs/n512/mean/seed1/best \
      --data bench/out/dyref_data/dev1000/data.json --n 200 --out bench/out/dyref_attention.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from posbias.checkpoint import load_checkpoint  # noqa: E402
from posbias.qa.explain import example_attention  # noqa: E402
from posbias.qa.readers import read_qa  # noqa: E402
from posbias.utils import atomic_write_json  # noqa: E402

NEAR = 3  # "near hit": the top token lies within this many tokens of the answer span


def measure(model_path: str, examples, n: int) -> dict:
    model, tokenizer, mcfg = load_checkpoint(model_path, task="qa")
    model.eval()
    rows = {"start": [], "end": []}
    skipped = 0
    for ex in examples[:n]:
        gold_text, gold_start = ex.answers[0].text, ex.answers[0].start
        r = example_attention(model, tokenizer, mcfg, ex.question, ex.context, gold_text, answer_start=gold_start)
        ctx, gold = r["context_tokens"], r["gold_tokens"]
        if not gold:
            skipped += 1
            continue
        att = r["attention"][:, ctx]  # (2, C)
        gold_cols = [ctx.index(g) for g in gold]
        near = range(max(0, gold_cols[0] - NEAR), min(len(ctx), gold_cols[-1] + NEAR + 1))
        for q, name, edge in ((0, "start", gold_cols[0]), (1, "end", gold_cols[-1])):
            top = int(np.argmax(att[q]))
            rows[name].append({"in_span": top in gold_cols, "boundary": top == edge, "near": top in near,
                               "chance_span": len(gold_cols) / len(ctx), "chance_boundary": 1 / len(ctx),
                               "chance_near": len(near) / len(ctx),
                               "lift": float(att[q, gold_cols].mean() / att[q].mean())})
    out = {"model": model_path, "questions": n, "skipped_gold_outside_window": skipped}
    for name, rs in rows.items():
        out[name] = {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} if rs else {}
        out[name]["lift_median"] = float(np.median([r["lift"] for r in rs])) if rs else float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", nargs="+", required=True, help="dynamic_query checkpoint folder(s)")
    ap.add_argument("--data", required=True, help="SQuAD-format file with gold answers")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", required=True, help="JSON results")
    args = ap.parse_args()
    examples = [ex for ex in read_qa(args.data).examples if ex.answers]
    results = [measure(m, examples, args.n) for m in args.model]
    atomic_write_json(args.out, {"data": args.data, "results": results})
    print("| model | query | in-span hit (chance) | boundary hit (chance) | near hit (chance) | lift mean / median "
          "| skipped |")
    print("|---|---|---|---|---|---|---|")
    for res in results:
        for q in ("start", "end"):
            r = res[q]
            print(f"| {res['model']} | {q} | {100 * r['in_span']:.1f}% ({100 * r['chance_span']:.1f}%) | "
                  f"{100 * r['boundary']:.1f}% ({100 * r['chance_boundary']:.1f}%) | "
                  f"{100 * r['near']:.1f}% ({100 * r['chance_near']:.1f}%) | "
                  f"{r['lift']:.2f} / {r['lift_median']:.2f} | {res['skipped_gold_outside_window']} |")


if __name__ == "__main__":
    main()
