"""Position bias of a causal LM in multi-document QA (`posbias diagnose generation`) on SQuAD v1.1 dev,
and the speed of its log-likelihood scoring against the bare model forward.

1. `posbias.diagnose_generation(model, SQuAD dev)`: `--questions` questions drawn at random, each with
   its gold paragraph at every position of `--k` documents, scored by log-likelihood (and generation
   with `--generation`), with both mitigations (`--mitigations`). Scores go to `--cache-dir` as they are
   computed: a killed run, rerun with the same options, resumes.
2. Speed: `--speed-prompts` of those prompts scored by posbias (`scoring.answer_logprobs`: left-padded,
   length-sorted batches, logits kept for the answer tokens only) against the bare forward over the
   same batches with every position's logits (what `model(input_ids).logits` computes). Medians of
   `--repeats` passes, alternating, in one process.

    python benchmarks/generation.py [--model gemma] [--k 5] [--questions 200] [--generation]
        [--mitigations reorder mspoe] [--cache-dir D] [--repeats 3] [--speed-prompts 16]

Writes bench/out/generation/<timestamp>/ (the diagnosis folder and bench.json) and prints the numbers.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "squad_v1.1" / "dev-v1.1.json.gz"))
    ap.add_argument("--model", default="gemma")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--generation", action="store_true", help="also score greedy generation")
    ap.add_argument("--mitigations", nargs="*", default=["reorder", "mspoe"])
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--speed-prompts", type=int, default=16)
    ap.add_argument("--bootstrap-samples", type=int, default=10000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    import posbias
    from posbias.generation import benchmark as B
    from posbias.generation.lm import load_lm
    from posbias.generation.scoring import answer_logprobs, encode_prompts, left_pad, length_batches
    from posbias.utils import cpu_name, versions

    out = Path(args.out or ROOT / "bench" / "out" / "generation" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    scorings = ("loglik", "generation") if args.generation else ("loglik",)
    t0 = time.time()
    res = posbias.diagnose_generation(args.model, args.data, out / "diagnosis", k=args.k, max_questions=args.questions,
                                      scorings=scorings, mitigations=tuple(args.mitigations), cache_dir=args.cache_dir,
                                      batch_size=args.batch_size, bootstrap_samples=args.bootstrap_samples,
                                      progress=False)
    diag_s = time.time() - t0
    print("\n".join(res["verdict_lines"]))

    # speed: the first prompts of the diagnosis, the gold document in the middle
    lm = load_lm(args.model, cache_dir=args.cache_dir)
    from posbias.qa.readers import read_dataset

    ds = read_dataset(args.data)
    scores = json.loads((out / "diagnosis" / "scores.json").read_text())
    ids = scores["question_ids"][:args.speed_prompts]
    mset = B.multi_document_qa(ds.examples, lm.count_tokens, k=args.k, max_doc_tokens=res["set"]["max_doc_tokens"],
                               seed=0, question_ids=ids)
    mid = (args.k + 1) // 2
    enc = encode_prompts(lm.tokenizer, [B.prompt(q.question, q.documents(mid)) for q in mset.questions],
                         [q.answers[0] for q in mset.questions])
    pad = lm.tokenizer.pad_token_id

    def ours() -> float:
        t = time.perf_counter()
        answer_logprobs(lm.model, enc, pad_id=pad, device=lm.device, batch_size=args.batch_size)
        return time.perf_counter() - t

    def bare() -> float:
        rows = [e.prompt + e.answer for e in enc]
        t = time.perf_counter()
        with torch.inference_mode():
            for b in length_batches([len(r) for r in rows], args.batch_size):
                ids_, mask, pos = left_pad([rows[i] for i in b], pad, lm.device)
                lm.model(input_ids=ids_, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()
        return time.perf_counter() - t

    ours()  # warm-up
    o, b = [], []
    for _ in range(args.repeats):
        o.append(ours())
        b.append(bare())
    tokens = sum(len(e.prompt) + len(e.answer) for e in enc)
    bench = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(),
             "threads": torch.get_num_threads(), "versions": versions(), "model": res["model"],
             "diagnosis_seconds": round(diag_s, 1), "seconds_per_prompt": res["seconds_per_prompt"],
             "prompts_computed": res["prompts_computed"],
             "speed": {"prompts": len(enc), "tokens": tokens, "posbias_s": statistics.median(o),
                       "bare_all_logits_s": statistics.median(b),
                       "posbias_tokens_per_s": tokens / statistics.median(o),
                       "bare_tokens_per_s": tokens / statistics.median(b),
                       "ratio_posbias_over_bare": statistics.median(b) / statistics.median(o),
                       "runs_s": {"posbias": o, "bare": b}}}
    (out / "bench.json").write_text(json.dumps(bench, indent=2))
    sp = bench["speed"]
    print(f"speed ({len(enc)} prompts, {tokens:,} tokens, median of {args.repeats}): posbias {sp['posbias_tokens_per_s']:.0f} "
          f"tokens/s, bare forward with all logits {sp['bare_tokens_per_s']:.0f} tokens/s, "
          f"ratio {sp['ratio_posbias_over_bare']:.2f}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
