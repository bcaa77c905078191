"""posbias inside a plain Hugging Face Trainer script: MiniLM on CoNLL-2003 D*_train trained by
`examples/hf_ner_trainer.py` without a mitigation, with the posbias RPP collator and with the CP
collator, same budget and seeds as `bench/tpb_conll_dstar.yaml` (posbias's own loop): 448 steps of
32 sentences (2 epochs of D*_train), lr 2e-4, 10% warm-up, weight decay 0.01, augment mode (a clean
and a perturbed pass per step). F1(α) on D*_test(k), k = 1..10, comes from the script's
PositionBiasCallback; the full test F1 from `posbias.evaluate` on the saved folder.

    python bench/hf_trainer_conll.py --method rpp --seed 1 --threads 1     # one run (~20-30 min)
    python bench/hf_trainer_conll.py --report                              # the table for BENCHMARKS.md

Run it from a frozen copy of the code (`git archive HEAD | tar -x -C /tmp/snap`, then
`PYTHONPATH=/tmp/snap python /tmp/snap/bench/...`) when the tree is being edited: a run imports
modules lazily over its half hour.

D*_train is written to the output folder (bench/out: CoNLL-2003 is never committed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out" / "hf_trainer_conll"
# posbias's own loop, same recipe (docs/experiments/tpb_conll_dstar): F1(10) per seed 1, 2, 3.
POSBIAS_LOOP = {"none": [85.00, 84.47, 84.88], "rpp": [83.35, 84.91, 84.96], "cp": [86.20, 85.82, 85.53]}


def dstar_train(out: Path) -> Path:
    """CoNLL-2003 train sentences between the Q1 and Q3 word lengths (posbias's D*_train)."""
    from posbias.config import resolve_path
    from posbias.tagging.duplicated import length_subset
    from posbias.tagging.readers import read_tagging
    from posbias.utils import atomic_write_text

    path = out / "dstar_train.conll"
    if not path.is_file():
        subset, info = length_subset(read_tagging(resolve_path("shared:conll2003/train.txt.gz")).examples, (0.25, 0.75))
        atomic_write_text(path, "\n\n".join("\n".join(f"{w} {t}" for w, t in zip(e.words, e.tags)) for e in subset) + "\n")
    return path


def run(method: str, seed: int, threads: int) -> dict:
    import importlib.util

    import torch

    from posbias.config import resolve_path
    from posbias.utils import cpu_name, now_iso, versions

    torch.set_num_threads(threads)
    OUT.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.spec_from_file_location("hf_ner_trainer", ROOT / "examples" / "hf_ner_trainer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    run_dir = OUT / f"{method}_seed{seed}"
    argv = ["--model", resolve_path("minilm"), "--train", str(dstar_train(OUT)),
            "--dev", resolve_path("shared:conll2003/test.txt"), "--out", str(run_dir), "--method", method,
            "--mode", "augment", "--max-steps", "448", "--lr", "2e-4", "--batch-size", "32", "--max-length", "256",
            "--k-max", "10", "--seed", str(seed)] + (["--cp-max-len", "128"] if method == "cp" else [])
    t0 = time.time()
    metrics = example.main(argv)
    record = {"method": method, "seed": seed, "metrics": metrics, "seconds": round(time.time() - t0, 1),
              "threads": threads, "cpu": cpu_name(), "finished": now_iso(), "versions": versions(),
              "command": f"python bench/hf_trainer_conll.py --method {method} --seed {seed} --threads {threads}",
              "argv": argv}
    (run_dir / "record.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


def rescore(method: str, seed: int, threads: int) -> dict:
    """The metrics of a run whose model was saved but whose record was not written (the process died
    after `trainer.save_model`): F1(α) through the same callback code on the saved folder, the full
    test F1 through `posbias.evaluate`. Training metrics (eval_loss) are not recomputed."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    import posbias
    from posbias.config import resolve_path
    from posbias.hf import PositionBiasCallback
    from posbias.utils import cpu_name, now_iso, versions

    torch.set_num_threads(threads)
    run_dir = OUT / f"{method}_seed{seed}"
    test = resolve_path("shared:conll2003/test.txt")
    t0 = time.time()
    model = AutoModelForTokenClassification.from_pretrained(str(run_dir)).eval()
    metrics = PositionBiasCallback(test, AutoTokenizer.from_pretrained(str(run_dir)), k_max=10).position_metrics(model)
    metrics["dev_f1"] = posbias.evaluate(str(run_dir), test, task="tagging", progress=False)["f1"]
    record = {"method": method, "seed": seed, "metrics": metrics, "seconds": None, "rescore_seconds": round(time.time() - t0, 1),
              "threads": threads, "cpu": cpu_name(), "finished": now_iso(), "versions": versions(),
              "command": f"python bench/hf_trainer_conll.py --method {method} --seed {seed} --threads {threads} --rescore"}
    (run_dir / "record.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


def report() -> str:
    from posbias.analysis.stats import paired_ttest

    recs = {}
    for f in sorted(OUT.glob("*_seed*/record.json")):
        r = json.loads(f.read_text(encoding="utf-8"))
        recs.setdefault(r["method"], {})[r["seed"]] = r
    rows = ["| HF Trainer script | seeds | F1 (D*_test) | F1(5) | F1(10) | Δ F1(10) vs none (t p) | full test F1 | "
            "posbias loop F1(10), same seeds | run time (s) |", "|---|---|---|---|---|---|---|---|---|"]
    base = {s: r["metrics"]["eval_f1_alpha_10"] for s, r in recs.get("none", {}).items()}
    for method in ("none", "rpp", "cp"):
        if method not in recs:
            continue
        by_seed = recs[method]
        cell = lambda key: _mean_sd([r["metrics"][key] for r in by_seed.values()])  # noqa: E731
        f10 = {s: r["metrics"]["eval_f1_alpha_10"] for s, r in by_seed.items()}
        delta = ""
        if method != "none" and base:
            t = paired_ttest(f10, base)
            delta = f"{t['diff']:+.2f}" + (f" (p {t['p']:.2f})" if t["p"] == t["p"] else "")  # NaN p: one pair
        loop = [POSBIAS_LOOP[method][s - 1] for s in sorted(by_seed) if s <= 3]
        rows.append(f"| {method} | {','.join(map(str, sorted(by_seed)))} | {cell('eval_f1_alpha_1')} | {cell('eval_f1_alpha_5')} | "
                    f"{cell('eval_f1_alpha_10')} | {delta} | {cell('dev_f1')} | "
                    f"{_mean_sd(loop)} | {_seconds(by_seed)} |")
    return "\n".join(rows)


def _mean_sd(values) -> str:
    """mean ± sample std; a single value has no std."""
    from posbias.analysis.stats import mean_std

    mean, std = mean_std(list(values))
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {std:.2f}"


def _seconds(by_seed: dict) -> str:
    timed = [r["seconds"] for r in by_seed.values() if r.get("seconds")]
    return f"{sum(timed) / len(timed):.0f}" if timed else "n/a"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", choices=["none", "rpp", "cp"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--rescore", action="store_true", help="score a run whose model was saved but not recorded")
    args = ap.parse_args()
    if args.report:
        print(report())
    elif args.rescore:
        print(json.dumps(rescore(args.method, args.seed, args.threads)["metrics"], indent=2))
    else:
        rec = run(args.method, args.seed, args.threads)
        print(json.dumps({k: rec[k] for k in ("method", "seed", "seconds")} | {"metrics": rec["metrics"]}, indent=2))


if __name__ == "__main__":
    main()
