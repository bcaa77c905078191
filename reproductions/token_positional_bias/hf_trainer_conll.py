"""posbias inside a plain Hugging Face Trainer script, under the token-classification authors'
settings: MiniLM on CoNLL-2003 D*_train trained by `examples/hf_ner_trainer.py` without a
mitigation (`none`), with the posbias RPP collator (`rpp`) and with the CP collator (`cp`, M = 128),
both in augment mode (a clean and a perturbed pass per step). The data and budget are those of
`tpb_conll_authors.yaml` beside this script (posbias's own loop): D* at the 15th-75th percentile of
train + dev + test pooled (the preset conll2003_dstar_minilm: 8,666 training sentences), BIOES tags,
every sub-token labelled with its word's label (`--bioes --label-all-tokens`), 2 epochs of 32
sentences (542 steps), lr 2e-4, 10% warm-up, weight decay 0.01, 256 tokens. Unlike the loop, the
script keeps its last weights (no D*_dev selection).

Each run saves its model to bench/out/hf_trainer_conll/<method>_seed<seed>/ with record.json (the
command, seconds, device, versions). Scoring is not the script's: `tpb_conll_hf.yaml` beside it
scores the saved folders as `checkpoint:` methods, with the same F1(alpha) on D*_test(k) (strict
word-level F1 and the authors' sub-token F1) and test F1 as tpb_conll_authors, into an experiment store:

    python reproductions/token_positional_bias/hf_trainer_conll.py --method cp --seed 1 --threads 1
        # one run (CPU: ~1-2 h for cp)
    posbias experiment run reproductions/token_positional_bias/tpb_conll_hf.yaml   # scores the saved runs
    posbias experiment report runs/experiments/tpb_conll_hf

On a GPU (issue 49): `bash tools/gpu/remote.sh item hf_conll SECONDS` runs the nine and the scoring.
Run it from a frozen copy of the code (`git archive HEAD | tar -x -C /tmp/snap`, then
`PYTHONPATH=/tmp/snap python /tmp/snap/reproductions/...`) when the tree is being edited: a run imports
modules lazily over its hour. D*_train is written to the output folder (bench/out: CoNLL-2003 is
never committed).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# bench/out/ (git-ignored) is where tpb_conll_hf.yaml reads the models; a `checkpoint:` run is recorded under
# a hash that names its model's path, so the archived store's runs keep theirs only there.
OUT = ROOT / "bench" / "out" / "hf_trainer_conll"
PRESET = "conll2003_dstar_minilm"
EPOCHS, BATCH, LR, MAX_LEN, CP_M = 2, 32, 2e-4, 256, 128


def dstar_train(out: Path) -> tuple[Path, int]:
    """The preset's D*_train (its bounds, its BIOES tags) as a CoNLL file, and its sentence count."""
    from posbias.config import load_config, preset_path
    from posbias.tagging.inputs import read_for
    from posbias.utils import atomic_write_text

    cfg = load_config(preset_path(PRESET))
    path = out / "dstar_train.conll"
    ds = read_for(cfg.data.train_file, cfg)
    if not path.is_file():
        atomic_write_text(path, "\n\n".join("\n".join(f"{w} {t}" for w, t in zip(e.words, e.tags))
                                            for e in ds.examples) + "\n")
    return path, len(ds.examples)


def run(method: str, seed: int, threads: int, max_steps: int | None = None, out: Path = OUT) -> dict:
    import importlib.util

    import torch

    from posbias.config import resolve_path
    from posbias.utils import atomic_write_json, cpu_name, now_iso, versions

    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.spec_from_file_location("hf_ner_trainer", ROOT / "examples" / "hf_ner_trainer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    run_dir = out / f"{method}_seed{seed}"
    train, n = dstar_train(out)
    steps = max_steps or EPOCHS * math.ceil(n / BATCH)
    argv = ["--model", resolve_path("minilm"), "--train", str(train), "--dev", resolve_path("shared:conll2003/valid.txt"),
            "--out", str(run_dir), "--method", method, "--mode", "augment", "--max-steps", str(steps),
            "--lr", str(LR), "--batch-size", str(BATCH), "--max-length", str(MAX_LEN), "--bioes", "--label-all-tokens",
            "--k-max", "0", "--seed", str(seed)] + (["--cp-max-len", str(CP_M)] if method == "cp" else [])
    t0 = time.time()
    metrics = example.main(argv)
    device = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else f"cpu ({cpu_name()})"
    record = {"method": method, "seed": seed, "steps": steps, "train_sentences": n, "metrics": metrics,
              "seconds": round(time.time() - t0, 1), "threads": threads, "device": device, "finished": now_iso(),
              "versions": versions(), "argv": argv,
              "command": f"python reproductions/token_positional_bias/hf_trainer_conll.py --method {method} "
                         f"--seed {seed} --threads {threads}"
                         + (f" --max-steps {max_steps}" if max_steps else "")}
    atomic_write_json(run_dir / "record.json", record)
    return record


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", choices=["none", "rpp", "cp"], required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-steps", type=int, help="fewer steps than the recipe's (a smoke test)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder of the runs (default: {OUT.relative_to(ROOT)})")
    args = ap.parse_args()
    rec = run(args.method, args.seed, args.threads, args.max_steps, args.out)
    print(json.dumps({k: rec[k] for k in ("method", "seed", "steps", "seconds", "device")}, indent=2))


if __name__ == "__main__":
    main()
