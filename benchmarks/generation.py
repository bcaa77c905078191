"""Position bias of a causal LM in multi-document QA (`posbias diagnose generation`) on SQuAD v1.1 dev,
and the speed of its log-likelihood scorer against fair baselines on the same prompts.

1. `posbias.diagnose_generation(model, SQuAD dev)`: `--questions` questions drawn at random, each with
   its gold paragraph at every position of `--k` documents, scored by log-likelihood (and generation
   with `--generation`), with both mitigations (`--mitigations`). Scores go to `--cache-dir` as they are
   computed: a killed run, rerun with the same options, resumes. `--no-diagnosis` skips it.
2. Speed: `--speed-prompts` prompts of the diagnosis's questions (the gold document in the middle)
   scored three ways, alternating, `--repeats` passes each, medians, in one process:
   - posbias (`scoring.answer_logprobs`: left-padded, length-sorted batches of `--batch-size`, logits
     kept for the answer tokens only);
   - the bare model forward over the same batches with the same `logits_to_keep`: the least any scorer
     of these prompts must compute;
   - lm-evaluation-harness's `HFLM.loglikelihood` (the reference implementation of this scoring) on
     the same (prompt, " answer") pairs, batch size `--batch-size`, the same model object. It needs
     `lm-eval` importable: `--lm-eval-site DIR` appends a folder holding it (`pip install --target DIR
     lm-eval==0.4.13`) to sys.path after posbias's own packages.
   The three give the same log-likelihoods (checked: the largest difference is printed).

    python benchmarks/generation.py [--model gemma] [--k 5] [--questions 200] [--generation]
        [--mitigations reorder mspoe] [--cache-dir D] [--repeats 3] [--speed-prompts 16] [--no-diagnosis]

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
    ap.add_argument("--no-diagnosis", action="store_true", help="the speed comparison only")
    ap.add_argument("--precision", default="auto", help="auto (bf16 where native), bf16 or fp32")
    ap.add_argument("--lm-eval-site", default=None, help="a folder holding lm-eval (appended to sys.path)")
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
    from posbias.generation.diagnose import ROOM
    from posbias.qa.readers import read_dataset
    from posbias.retrieval.benchmark import answerable

    lm = load_lm(args.model, cache_dir=args.cache_dir, precision=args.precision)
    ds = read_dataset(args.data)
    res, diag_s = None, None
    if not args.no_diagnosis:
        t0 = time.time()
        res = posbias.diagnose_generation(lm, args.data, out / "diagnosis", k=args.k, max_questions=args.questions,
                                          scorings=scorings, mitigations=tuple(args.mitigations),
                                          cache_dir=args.cache_dir, batch_size=args.batch_size,
                                          bootstrap_samples=args.bootstrap_samples, progress=False)
        diag_s = time.time() - t0
        print("\n".join(res["verdict_lines"]))
        ids = json.loads((out / "diagnosis" / "scores.json").read_text())["question_ids"][:args.speed_prompts]
    else:  # the diagnosis's own draw of questions
        import random

        usable = answerable(ds.examples)
        pick = sorted(random.Random("questions:0").sample(range(len(usable)), args.questions))
        ids = [usable[i].id for i in pick][:args.speed_prompts]
    budget = min(lm.context_length, 4096) - ROOM

    # speed: the first prompts of the diagnosis, the gold document in the middle
    mset = B.multi_document_qa(ds.examples, lm.count_tokens, k=args.k, max_doc_tokens=budget, seed=0, question_ids=ids)
    mid = (args.k + 1) // 2
    texts = [B.prompt(q.question, q.documents(mid)) for q in mset.questions]
    answers = [q.answers[0] for q in mset.questions]
    enc = encode_prompts(lm.tokenizer, texts, answers)
    pad = lm.tokenizer.pad_token_id
    got = {}

    def ours() -> float:
        t = time.perf_counter()
        got["posbias"] = answer_logprobs(lm.model, enc, pad_id=pad, device=lm.device, batch_size=args.batch_size)
        return time.perf_counter() - t

    def bare() -> float:
        rows = [e.prompt + e.answer for e in enc]
        t = time.perf_counter()
        with torch.inference_mode():
            for b in length_batches([len(r) for r in rows], args.batch_size):
                ids_, mask, pos = left_pad([rows[i] for i in b], pad, lm.device)
                keep = max(len(enc[i].answer) for i in b) + 1
                lm.model(input_ids=ids_, attention_mask=mask, position_ids=pos, use_cache=False,
                         logits_to_keep=keep).logits.float()
        return time.perf_counter() - t

    harness = None
    if args.lm_eval_site:
        sys.path.append(args.lm_eval_site)
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM

        harness = HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=args.batch_size,
                       add_bos_token=bool(enc[0].prompt[:1] == [lm.tokenizer.bos_token_id]))
        requests = [Instance(request_type="loglikelihood", doc={}, arguments=(t, " " + a.strip()), idx=i)
                    for i, (t, a) in enumerate(zip(texts, answers))]
    except ImportError:
        print("lm-eval is not importable: its column is left out (--lm-eval-site)")

    def lm_eval() -> float:
        t = time.perf_counter()
        out_ = harness.loglikelihood(requests, disable_tqdm=True)
        got["lm_eval"] = [s / len(e.answer) for (s, _), e in zip(out_, enc)]
        return time.perf_counter() - t

    runners = {"posbias": ours, "bare_logits_to_keep": bare, **({"lm_eval": lm_eval} if harness else {})}
    for fn in runners.values():
        fn()  # warm-up
    runs = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, fn in runners.items():
            runs[name].append(fn())
    tokens = sum(len(e.prompt) + len(e.answer) for e in enc)
    med = {name: statistics.median(v) for name, v in runs.items()}
    agree = (max(abs(a - b) for a, b in zip(got["posbias"], got["lm_eval"])) if "lm_eval" in got else None)
    bench = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(),
             "threads": torch.get_num_threads(), "versions": versions(), "model": lm.describe(),
             "diagnosis_seconds": None if diag_s is None else round(diag_s, 1),
             "seconds_per_prompt": res and res["seconds_per_prompt"],
             "prompts_computed": res and res["prompts_computed"],
             "speed": {"prompts": len(enc), "tokens": tokens, "batch_size": args.batch_size, "median_s": med,
                       "tokens_per_s": {n: tokens / v for n, v in med.items()},
                       "ratio_posbias_over": {n: v / med["posbias"] for n, v in med.items() if n != "posbias"},
                       "max_abs_loglik_diff_posbias_lm_eval": agree, "runs_s": runs}}
    (out / "bench.json").write_text(json.dumps(bench, indent=2))
    sp = bench["speed"]
    print(f"speed ({len(enc)} prompts, {tokens:,} tokens, median of {args.repeats}): "
          + ", ".join(f"{n} {v:.0f} tokens/s" for n, v in sp["tokens_per_s"].items())
          + "; posbias is " + ", ".join(f"{r:.2f}x {n}" for n, r in sp["ratio_posbias_over"].items())
          + (f"; max |posbias - lm-eval| {agree:.2e} nats per token" if agree is not None else ""))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
