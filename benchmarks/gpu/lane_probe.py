"""How many training processes one GPU takes: posbias's steps/s with 1, 3, 6 ... concurrent runs.

Plans queue items (issue 49) before their GPU time: a MiniLM-L6 run is small enough that one process
leaves the GPU mostly idle, so grids run as concurrent lanes (tools/gpu/lanes.py). This starts N
`posbias train qa` processes at once on the same recipe (a MiniLM-shaped encoder with random weights:
speed does not depend on the weight values), each its own seed, and reads their train_log.jsonl:
per-process steps/s (the median over log windows after the first) and the aggregate.

    python benchmarks/gpu/lane_probe.py --data TRAIN.json.gz --tokenizer DIR --lanes 1 3 6 --steps 600 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

MINILM = {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "vocab_size": 30522, "max_position_embeddings": 512}


def run_group(n: int, args, out: Path) -> dict:
    cfg = {"model": {"name_or_path": None, "tokenizer": args.tokenizer, "encoder": MINILM},
           "data": {"train_file": args.data, "eval_file": None, "max_seq_len": 384, "stride": 128,
                    "unanswerable_windows": "cls"},
           "train": {"max_steps": args.steps, "batch_size": 16, "lr": 1e-4, "log_every": args.log_every,
                     "device": args.device, "mixed_precision": args.precision},
           "perturb": [{"name": "random_padding"}] if args.random_padding else []}
    group = out / f"lanes{n}"
    group.mkdir(parents=True, exist_ok=True)
    (group / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    procs = []
    for i in range(n):
        cmd = [sys.executable, "-m", "posbias", "train", "qa", "-c", str(group / "config.yaml"),
               f"train.output_dir={group / f'run{i}'}", f"train.seed={i + 1}", "--overwrite"]
        procs.append(subprocess.Popen(cmd, stdout=open(group / f"run{i}.log", "w"), stderr=subprocess.STDOUT, env=env))
    codes = [p.wait() for p in procs]
    wall = time.time() - t0
    per = []
    for i in range(n):
        log = group / f"run{i}" / "train_log.jsonl"
        recs = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
        rates = [r["examples_per_s"] / 16 for r in recs[1:]]  # the first window holds the warm-up
        toks = [r["tokens_per_s"] for r in recs[1:]]
        info = group / f"run{i}" / "run_info.json"
        seconds = json.loads(info.read_text()).get("train_seconds") if info.is_file() else None
        per.append({"returncode": codes[i], "steps_per_s": statistics.median(rates) if rates else None,
                    "tokens_per_s": statistics.median(toks) if toks else None, "train_seconds": seconds})
    ok = [p["steps_per_s"] for p in per if p["steps_per_s"]]
    return {"lanes": n, "wall_s": round(wall, 1), "runs": per,
            "steps_per_s_median": statistics.median(ok) if ok else None,
            "steps_per_s_total": sum(ok) if ok else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 3, 6])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="no")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--random-padding", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=1e9, help="start no group after this many seconds")
    ap.add_argument("--out", required=True, help="folder for the runs")
    ap.add_argument("--json", default=None, help="where the results go (default OUT/lane_probe.json)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    result = {"config": vars(args), "groups": [], "skipped": []}
    for n in args.lanes:
        if time.time() - t0 > args.max_seconds:
            result["skipped"].append(n)
            continue
        g = run_group(n, args, out)
        result["groups"].append(g)
        print(f"lanes {n}: {g['steps_per_s_median']} steps/s per process, {g['steps_per_s_total']} in all, "
              f"wall {g['wall_s']} s", flush=True)
        Path(args.json or out / "lane_probe.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
