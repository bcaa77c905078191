"""Peak memory of `posbias evaluate qa` (issue 27 item 11: memory proportional to the batch in flight).

Runs `posbias evaluate qa --model CKPT --data DATA --output-dir OUT` in a child process (so its RSS
is its own: nothing of this script is counted) with one thread, and reports the child's peak
resident set size (`getrusage(RUSAGE_CHILDREN).ru_maxrss`) and wall time. With `--base PATH` the
same command also runs on another checkout of posbias (PYTHONPATH=PATH, e.g. an unpacked
`git archive` of the previous commit), and the two output folders are compared file by file.

Usage:
    python benchmarks/eval_memory.py --model <qa checkpoint> \
        [--data /work/shared/data/squad_v1.1/dev-v1.1.json.gz] [--base /tmp/base] [override ...]
Prints one markdown row per run; writes bench/out/eval_memory/<timestamp>/result.json.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posbias.utils import cpu_name, now_iso  # noqa: E402

SQUAD_DEV = ROOT.parent / "shared" / "data" / "squad_v1.1" / "dev-v1.1.json.gz"
COMPARED = ("predictions.json", "nbest.json", "null_odds.json", "metrics.json")


def measure(code: Path, model: str, data: str, out_dir: Path, overrides: list[str]) -> dict:
    """Peak RSS (MiB) and wall seconds of one `posbias evaluate qa` run with posbias from `code`.

    Each run is its own child of a fresh Python process, so RUSAGE_CHILDREN holds only that run.
    """
    cmd = [sys.executable, "-m", "posbias", "evaluate", "qa", "--model", model, "--data", data,
           "--output-dir", str(out_dir), *overrides]
    probe = ("import resource, subprocess, sys, time; t = time.time(); "
             "rc = subprocess.run(sys.argv[1:]).returncode; w = time.time() - t; "
             "print('@@', rc, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    # cwd = the checkout: `python -m` puts the working directory first on sys.path.
    proc = subprocess.run([sys.executable, "-c", probe, *cmd], env=env, capture_output=True, text=True, cwd=code)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if line is None or line.split()[1] != "0":
        sys.exit(f"evaluate failed ({code}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    _, _, wall, maxrss_kib = line.split()
    shown = " ".join(["posbias", *cmd[3:]]).replace(str(out_dir), "OUT")
    return {"code": str(code), "command": shown, "peak_rss_mib": int(maxrss_kib) / 1024,
            "wall_s": float(wall), "output_dir": str(out_dir)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="QA checkpoint (e.g. a MiniLM run's best/)")
    ap.add_argument("--data", default=str(SQUAD_DEV))
    ap.add_argument("--base", help="another posbias checkout to measure the same way (before)")
    ap.add_argument("--skip-current", action="store_true", help="measure only --base")
    ap.add_argument("overrides", nargs="*", help="evaluation overrides, e.g. train.eval_batch_size=32")
    args = ap.parse_args()
    model, data = str(Path(args.model).resolve()), str(Path(args.data).resolve())

    out = ROOT / "bench" / "out" / "eval_memory" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    if args.base:
        runs["before"] = measure(Path(args.base).resolve(), model, data, out / "before", args.overrides)
    if not args.skip_current:
        runs["after"] = measure(ROOT, model, data, out / "after", args.overrides)
    result = {"date": now_iso(), "cpu": cpu_name(), "threads": 1, "data": args.data, "model": args.model,
              "runs": runs}
    if len(runs) == 2:
        result["identical_outputs"] = {
            f: filecmp.cmp(out / "before" / f, out / "after" / f, shallow=False)
            for f in COMPARED if (out / "before" / f).exists()}
        # Batching (train.eval_batch_tokens) moves n-best probabilities in the last bits: compare answers.
        before, after = (json.loads((out / r / "predictions.json").read_text()) for r in ("before", "after"))
        result["same_predictions"] = before == after
        result["metrics"] = {r: {k: v for k, v in json.loads((out / r / "metrics.json").read_text()).items()
                                 if k in ("exact_match", "f1", "exact", "HasAns_f1")} for r in ("before", "after")}
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")

    print("| run | peak RSS | wall time | CPU (1 thread) | date | command |")
    print("|---|---|---|---|---|---|")
    for name, r in runs.items():
        print(f"| {name} | {r['peak_rss_mib'] / 1024:.2f} GiB | {r['wall_s']:.0f} s | {result['cpu']} | "
              f"{result['date'][:10]} | `{r['command']}` |")
    if "identical_outputs" in result:
        print("identical outputs:", result["identical_outputs"])
        print("same predictions:", result["same_predictions"], "metrics:", result["metrics"])
    print(f"wrote {out / 'result.json'}")


if __name__ == "__main__":
    main()
