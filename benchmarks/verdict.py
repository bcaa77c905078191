"""Cost of the position-bias verdict that opens every diagnosis (`posbias.analysis.verdict`).

QA: `posbias.qa.diagnose.position_verdict` (sized front − rear with a within-group bootstrap, the
trend with a bootstrap and a permutation test, PSI with its bootstrap, on two axes) against the
bucket drop/PSI bootstrap it replaced (`posbias.analysis.bias.qa_position_bias`), on synthetic
per-question scores of SQuAD v1.1 dev's size (10,570 questions). Tagging: `alpha_axis` on the
counts of a CoNLL-2003-test-sized D* (1,909 sentences, k_max = 10: 55 cells) plus the precision and
recall intervals of the plot. Medians over `--repeats` runs, 2,000 resamples each.

    python benchmarks/verdict.py [--repeats 5] [--questions 10570] [--sentences 1909]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import numpy as np


def qa_inputs(n: int, seed: int = 0):
    from posbias.qa.positions import quartile_labels

    rng = np.random.default_rng(seed)
    # SQuAD-like: most answers early in a 384-token window, F1 0/1 with a mild fall with position
    pos = np.minimum(rng.exponential(70, n).astype(int), 383)
    f1 = (rng.random(n) < 0.8 - 0.0005 * pos).astype(float)
    ids = [f"q{i}" for i in range(n)]
    starts = dict(zip(ids, pos.tolist()))
    quart = quartile_labels(starts, 384)
    sent = {q: str(min(5, 1 + p // 40)) if p < 160 else "5+" for q, p in starts.items()}
    return {"gold_position_quartile": quart, "answer_sentence": sent}, starts, {q: (s, s) for q, s in zip(ids, f1)}


def tagging_inputs(n: int, k_max: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    cells = [(k, a) for k in range(1, k_max + 1) for a in range(1, k + 1)]
    gold = rng.integers(0, 4, n)
    counts = {}
    tp = np.stack([rng.binomial(gold, 0.88 - 0.002 * a) for _, a in cells])
    pred = tp + rng.binomial(2, 0.05, size=tp.shape)
    counts["f1"] = np.stack([2 * tp, pred + gold], -1)
    counts["precision"] = np.stack([tp, pred], -1)
    counts["recall"] = np.stack([tp, np.broadcast_to(gold, tp.shape)], -1)
    return cells, counts


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--questions", type=int, default=10_570)
    ap.add_argument("--sentences", type=int, default=1_909)
    ap.add_argument("--samples", type=int, default=2000)
    args = ap.parse_args()

    from posbias.analysis.bias import qa_position_bias
    from posbias.analysis.verdict import alpha_axis, curve_intervals
    from posbias.qa.diagnose import position_verdict

    labels, starts, scores = qa_inputs(args.questions)
    cells, counts = tagging_inputs(args.sentences)
    runs = {
        "qa: bucket drop/PSI bootstrap (before)": lambda: qa_position_bias(labels, scores, samples=args.samples),
        "qa: verdict, two axes (now)": lambda: position_verdict(labels, starts, scores, 60.0, samples=args.samples),
        "tagging: verdict + P/R intervals (now)": lambda: (
            alpha_axis(cells, counts["f1"], samples=args.samples),
            [curve_intervals(cells, counts[k], samples=args.samples) for k in ("precision", "recall")]),
    }
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), platform.processor())
    print(f"# {cpu}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; numpy {np.__version__}; "
          f"{args.questions:,} questions, {args.sentences:,} sentences x {len(cells)} cells, {args.samples:,} resamples, "
          f"median of {args.repeats}")
    base = None
    for name, fn in runs.items():
        fn()  # warm-up
        t = statistics.median(timed(fn, args.repeats))
        base = base or t
        print(f"| {name} | {t:.2f} s | x{t / base:.2f} |")


if __name__ == "__main__":
    main()
