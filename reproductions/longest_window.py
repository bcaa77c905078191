"""The longest training input of an experiment's runs, in tokens: the first position id no training
window reaches, which a positive control's `model.reinit_positions_from` names (the baseline never
trains the rows from there on). Reads each run's training data as training does (the task's reader,
`data.max_train_examples`, the task's training features, the run's tokenizer) and prints, per distinct
data setting, the longest window, a few quantiles and how many windows pass some lengths.

    python reproductions/longest_window.py reproductions/random_padding/rp_full.yaml \
        --train-file bench/out/gpu_data/build/train_d50/train.json

`--train-file` stands in for the spec's `data.train_file` (e.g. the file `tools/gpu/pack.sh` builds
before gzipping it); `--only` picks runs by name pattern (default: the first seed of every method).
"""
from __future__ import annotations

import argparse
import fnmatch
import json

import numpy as np

from posbias.config import build_config
from posbias.experiment import load_experiment
from posbias.tasks import get_task
from posbias.training import train_subset


def window_lengths(cfg) -> np.ndarray:
    """The token count of every training window `cfg`'s run trains on."""
    task = get_task(cfg.task, "task")
    tokenizer = task.load_tokenizer(cfg)
    ds = task.read(cfg.data.train_file, cfg)
    examples = train_subset(ds.examples, cfg.data.max_train_examples, cfg.data.train_subset, cfg.train.seed)
    return np.asarray(task.train_features(examples, tokenizer, cfg, ds).lengths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", help="an experiment spec (YAML)")
    ap.add_argument("--train-file", help="read this file instead of the spec's data.train_file")
    ap.add_argument("--only", nargs="+", metavar="PATTERN", help="run names (fnmatch; default: each method's first seed)")
    args = ap.parse_args(argv)
    exp = load_experiment(args.spec, output_dir="runs/longest_window")
    runs = exp.runs
    if args.only:
        runs = [r for r in runs if any(fnmatch.fnmatch(r.name, p) for p in args.only)]
    else:
        first = min(r.seed for r in runs)
        runs = [r for r in runs if r.seed == first]
    seen: dict = {}
    for run in runs:
        d = run.config.to_dict()
        if args.train_file:
            d["data"]["train_file"] = args.train_file
        d["model"]["reinit_positions_from"] = None  # what the data reaches, whatever the spec re-initialises
        cfg = build_config(d)
        key = json.dumps({"task": cfg.task, "data": d["data"], "tokenizer": d["model"].get("tokenizer"),
                          "model": d["model"].get("name_or_path"), "seed": cfg.train.seed}, sort_keys=True, default=str)
        if key not in seen:
            seen[key] = (window_lengths(cfg), [])
        seen[key][1].append(run.name)
    for lengths, names in seen.values():
        q = np.percentile(lengths, [50, 99, 99.9])
        print(f"{', '.join(names)}: {len(lengths):,} training window{'s' * (len(lengths) != 1)}, the longest {int(lengths.max())} tokens "
              f"(ids 0-{int(lengths.max()) - 1}); median {q[0]:.0f}, 99th percentile {q[1]:.0f}, 99.9th {q[2]:.0f}; "
              + ", ".join(f"{int((lengths > n).sum())} longer than {n}" for n in (96, 112, 128)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
