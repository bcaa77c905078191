"""A tagger trained outside posbias, to show `posbias diagnose tagging` on an outside checkpoint.

A plain transformers fine-tune: AutoModelForTokenClassification on MiniLM, transformers' Trainer,
DataCollatorForTokenClassification (dynamic padding), labels on first sub-tokens (run_ner.py's
recipe). Only the data reading uses posbias (its CoNLL reader and the D* length subset, so the
training set is the same D*_train as the reproduction's). Then:

    posbias diagnose tagging --model <out>/model --data shared:conll2003/test.txt --output-dir <out>/diagnosis

Usage:
    python reproductions/token_positional_bias/outside_tagger.py --out bench/out/outside_tagger \
        [--epochs 3] [--lr 2e-4] [--batch-size 32]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def benchmark_tagging():
    """benchmarks/tagging.py as a module (benchmarks/ is no package): its `hf_features`, the run_ner
    recipe's features."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmarks_tagging", ROOT / "benchmarks" / "tagging.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "outside_tagger"))
    ap.add_argument("--train", default="shared:conll2003/train.txt.gz")
    ap.add_argument("--test", default="shared:conll2003/test.txt")
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=-1)
    args = ap.parse_args()

    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainingArguments)

    hf_features = benchmark_tagging().hf_features

    from posbias.config import resolve_path
    from posbias.tagging.duplicated import length_subset
    from posbias.tagging.readers import read_tagging

    examples, info = length_subset(read_tagging(resolve_path(args.train)).examples, (0.25, 0.75))
    labels = sorted({t for e in examples for t in e.tags}, key=lambda t: (t != "O", t))
    label_id = {t: i for i, t in enumerate(labels)}
    minilm = resolve_path("minilm")
    tok = AutoTokenizer.from_pretrained(minilm)
    train = hf_features(examples, tok, label_id)  # run_ner.py's tokenize_and_align_labels
    model = AutoModelForTokenClassification.from_pretrained(minilm, num_labels=len(labels),
                                                            id2label=dict(enumerate(labels)), label2id=label_id)
    out = Path(args.out)
    targs = TrainingArguments(output_dir=str(out / "trainer"), per_device_train_batch_size=args.batch_size,
                              learning_rate=args.lr, num_train_epochs=args.epochs, max_steps=args.max_steps,
                              warmup_steps=0.1, weight_decay=0.01, seed=args.seed, report_to=[], save_strategy="no",
                              logging_steps=50, use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=targs, train_dataset=train, data_collator=DataCollatorForTokenClassification(tok)).train()
    model.save_pretrained(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    print(f"trained on {len(train)} D*_train sentences (lengths {info['length_bounds']}); saved {out / 'model'}")
    cmd = [str(Path(sys.executable).parent / "posbias"), "diagnose", "tagging", "--model", str(out / "model"),
           "--data", args.test, "--output-dir", str(out / "diagnosis")]
    print(" ".join(cmd), flush=True)
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
