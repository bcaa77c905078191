r"""A standard Hugging Face Trainer extractive-QA fine-tune (SQuAD-style windows), plus posbias:
Random Padding as a data collator, then posbias's evaluation and answer-position diagnosis of the
saved model.

    python examples/hf_qa_trainer.py --model bert-base-uncased --train train-v1.1.json \
        --dev dev-v1.1.json --out runs/hf_qa
    python examples/hf_qa_trainer.py --model minilm --train demo:train --dev demo:dev \
        --out runs/hf_qa_demo --max-steps 100     # offline: posbias's bundled names

--model, --train and --dev take the names the posbias CLI takes (`minilm`, `demo:...`,
`shared:...`). Everything but the lines marked `posbias` is the usual script; drop them for the
plain baseline.
"""
import argparse
import json
import sys
from pathlib import Path

from datasets import Dataset
from transformers import (AutoModelForQuestionAnswering, AutoTokenizer, Trainer, TrainingArguments,
                          default_data_collator)

import posbias  # posbias
import posbias.hf  # posbias
from posbias.config import resolve_path  # posbias: `demo:` / `shared:` data names
from posbias.encoders import local_dir  # posbias: `minilm`, a local folder or a Hub id
from posbias.errors import ConfigError, PosbiasError  # posbias
from posbias.qa.readers import read_qa  # SQuAD JSON / MRQA JSONL reader (any SQuAD-column source works)


def load(path):
    ex = [e for e in read_qa(path).examples if e.answers]
    return Dataset.from_dict({"question": [e.question for e in ex], "context": [e.context for e in ex],
                              "answer_start": [e.answers[0].start for e in ex],
                              "answer_text": [e.answers[0].text for e in ex]})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="encoder: a local folder, a Hub id, or `minilm` (the bundled MiniLM)")
    ap.add_argument("--train", required=True, help="SQuAD JSON(.gz) or MRQA JSONL(.gz), or a posbias name (demo:train)")
    ap.add_argument("--dev", required=True, help="SQuAD-format file scored and diagnosed after training")
    ap.add_argument("--out", required=True, help="folder of the saved model (and its diagnosis/)")
    ap.add_argument("--method", choices=["none", "random_padding"], default="random_padding",
                    help="mitigation (default: random_padding)")
    ap.add_argument("--max-steps", type=int, default=1000, help="optimizer steps (default: 1000)")
    ap.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (default: 2e-4)")
    ap.add_argument("--batch-size", type=int, default=16, help="windows per batch (default: 16)")
    ap.add_argument("--max-length", type=int, default=256, help="tokens of a window (default: 256)")
    ap.add_argument("--stride", type=int, default=64, help="tokens shared by consecutive windows (default: 64)")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    args.model = local_dir(resolve_path(args.model), "--model")  # posbias: the CLI's model names
    args.train, args.dev = resolve_path(args.train), resolve_path(args.dev)  # posbias: the CLI's data names
    if not (Path(args.model) / "config.json").is_file():  # posbias: one line, not transformers' guesses
        raise ConfigError(f"--model: {args.model} holds no config.json (not a model folder)")

    train = load(args.train)
    read_qa(args.dev)  # posbias: a bad dev file fails now, not after training
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    model = AutoModelForQuestionAnswering.from_pretrained(args.model, trust_remote_code=False)

    def windows(batch):  # the usual run_qa.py pre-processing: overlapping windows, answer token span
        enc = tokenizer(batch["question"], batch["context"], truncation="only_second", max_length=args.max_length,
                        stride=args.stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                        padding="max_length")
        enc["start_positions"], enc["end_positions"] = [], []
        for i, offsets in enumerate(enc.pop("offset_mapping")):
            j = enc["overflow_to_sample_mapping"][i]
            a = batch["answer_start"][j]
            b = a + len(batch["answer_text"][j])
            seq = enc.sequence_ids(i)
            ctx = [t for t, s in enumerate(seq) if s == 1]
            if offsets[ctx[0]][0] > a or offsets[ctx[-1]][1] < b:  # answer not in this window: [CLS]
                enc["start_positions"].append(0)
                enc["end_positions"].append(0)
                continue
            enc["start_positions"].append(next(t for t in ctx if offsets[t][1] > a))
            enc["end_positions"].append(next(t for t in reversed(ctx) if offsets[t][0] < b))
        enc.pop("overflow_to_sample_mapping")
        return enc

    train = train.map(windows, batched=True, remove_columns=train.column_names)
    collator = default_data_collator
    if args.method == "random_padding":  # posbias: the shift k ~ U{0 .. n - m}, n = the window length
        collator = posbias.hf.PositionShiftCollator(collator, model, tokenizer, method="random_padding",
                                                    max_len=args.max_length, seed=args.seed)
    training_args = TrainingArguments(
        output_dir=args.out, max_steps=args.max_steps, learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
        warmup_steps=args.max_steps // 10, weight_decay=0.01, save_strategy="no", logging_steps=50, report_to="none", seed=args.seed)
    Trainer(model=model, args=training_args, train_dataset=train, data_collator=collator).train()
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    # posbias: SQuAD EM/F1 of the saved HF folder, and where in the context its answers go wrong
    windows_as_trained = [f"data.max_seq_len={args.max_length}", f"data.stride={args.stride}"]
    metrics = posbias.evaluate(args.out, args.dev, task="qa", overrides=windows_as_trained, progress=False)
    posbias.diagnose(args.out, args.dev, f"{args.out}/diagnosis", task="qa", progress=False,
                     overrides=windows_as_trained)
    print(json.dumps({k: v for k, v in metrics.items() if k in ("exact_match", "exact", "f1", "total")}, indent=2))
    return metrics


def run(argv=None) -> int:
    """main(), with bad input (a missing file, an unknown name) reported in one line, exit code 2, as
    the posbias CLI does."""
    try:
        main(argv)
    except (PosbiasError, OSError) as e:  # OSError: a file or folder that cannot be read or written
        print(f"{Path(__file__).name}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run())
