r"""A standard Hugging Face Trainer NER fine-tune, plus posbias: a position-bias mitigation (RPP or
Context Perturbation) as a data collator, and F1(alpha) on duplicated test sets at every evaluation.

    python examples/hf_ner_trainer.py --model bert-base-cased --train train.conll --dev dev.conll \
        --out runs/hf_ner --method rpp
    python examples/hf_ner_trainer.py --model minilm --train demo:wnut-train --dev demo:wnut-dev \
        --out runs/hf_ner_cp --method cp --max-steps 100     # offline: posbias's bundled names
    python examples/hf_ner_trainer.py --model minilm --train train.conll --dev test.conll --out runs/hf_ner \
        --method cp --bioes --label-all-tokens --quantiles 0.15 0.75 --length-pool train.conll dev.conll test.conll
        # the token-classification authors' settings: IOBES tags, every sub-token labelled, D* bounds
        # at the 15th-75th percentile of train + dev + test

--model, --train and --dev take the names the posbias CLI takes (`minilm`, `demo:...`,
`shared:...`). Everything but the lines marked `posbias` is the usual script; drop them for the
plain baseline.
"""
import argparse
import json
import sys
from pathlib import Path

from datasets import Dataset
from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification, Trainer,
                          TrainingArguments)

import posbias  # posbias
import posbias.hf  # posbias
from posbias.config import resolve_path  # posbias: `demo:` / `shared:` data names
from posbias.encoders import local_dir  # posbias: `minilm`, a local folder or a Hub id
from posbias.errors import ConfigError, PosbiasError  # posbias
from posbias.tagging.readers import read_tagging  # CoNLL / CoNLL-U reader (any words + tags source works)
from posbias.tagging.schemes import convert  # posbias: IOB1 / IOB2 -> BIOES (IOBES)


def load(path, bioes=False):
    ds = read_tagging(path)
    tags = [e.tags for e in ds.examples]
    if bioes and ds.scheme not in ("bioes", "none"):  # POS tags (scheme none) have no prefixes to convert
        tags = [convert(t, ds.scheme, "bioes") for t in tags]
    return Dataset.from_dict({"tokens": [e.words for e in ds.examples], "tags": tags})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="encoder: a local folder, a Hub id, or `minilm` (the bundled MiniLM)")
    ap.add_argument("--train", required=True, help="CoNLL / CoNLL-U training file, or a posbias name (demo:wnut-train)")
    ap.add_argument("--dev", required=True, help="CoNLL / CoNLL-U file for evaluation and F1(alpha)")
    ap.add_argument("--out", required=True, help="folder of the saved model")
    ap.add_argument("--method", choices=["none", "rpp", "cp"], default="rpp",
                    help="mitigation: Random Position Perturbation, Context Perturbation, or none (default: rpp)")
    ap.add_argument("--mode", choices=["replace", "augment"], default="augment",
                    help="augment (default): the authors' clean + perturbed step; replace: the perturbed batch only")
    ap.add_argument("--max-steps", type=int, default=1000, help="optimizer steps (default: 1000)")
    ap.add_argument("--lr", type=float, default=2e-4, help="peak learning rate (default: 2e-4)")
    ap.add_argument("--batch-size", type=int, default=16, help="sentences per batch (default: 16)")
    ap.add_argument("--max-length", type=int, default=128, help="tokens kept of a sentence (default: 128)")
    # 128: the M of BENCHMARKS.md's CoNLL runs (reproductions/token_positional_bias/hf_trainer_conll.py);
    # the paper's whole table (512) packs 4x the tokens.
    ap.add_argument("--cp-max-len", type=int, default=128,
                    help="CP's M, the most tokens of a concatenation of sentences (default: 128; the paper: the "
                         "model's whole position table, e.g. 512, several times slower on a CPU)")
    ap.add_argument("--bioes", action="store_true", help="train on BIOES (IOBES) tags, converted from the files' IOB tags")
    ap.add_argument("--label-all-tokens", action="store_true",
                    help="train every sub-token on its word's label (default: the first sub-token only, the others -100)")
    ap.add_argument("--k-max", type=int, default=10,
                    help="F1(alpha) on test copies k = 1..K_MAX (default: 10; 0: no F1(alpha))")
    ap.add_argument("--quantiles", type=float, nargs=2, default=(0.25, 0.75), metavar=("LO", "HI"),
                    help="D*'s length bounds for F1(alpha), quantiles of the sentence lengths (default: 0.25 0.75)")
    ap.add_argument("--length-pool", nargs="+", metavar="FILE",
                    help="files whose pooled sentence lengths the quantiles are taken of (default: --dev's own)")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    args.model = local_dir(resolve_path(args.model), "--model")  # posbias: the CLI's model names
    args.train, args.dev = resolve_path(args.train), resolve_path(args.dev)  # posbias: the CLI's data names
    pool = [resolve_path(f) for f in args.length_pool] if args.length_pool else None  # posbias
    if not (Path(args.model) / "config.json").is_file():  # posbias: one line, not transformers' guesses
        raise ConfigError(f"--model: {args.model} holds no config.json (not a model folder)")

    train, dev = load(args.train, args.bioes), load(args.dev, args.bioes)
    labels = sorted({t for tags in train["tags"] for t in tags})
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model, trust_remote_code=False, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})

    def encode(batch):
        enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=args.max_length)
        enc["labels"] = []
        for i, tags in enumerate(batch["tags"]):
            prev, row = None, []
            for w in enc.word_ids(i):  # the first sub-token of each word carries its label (or all of them)
                row.append(-100 if w is None or (w == prev and not args.label_all_tokens) else labels.index(tags[w]))
                prev = w
            enc["labels"].append(row)
        return enc

    train = train.map(encode, batched=True, remove_columns=train.column_names)
    dev = dev.map(encode, batched=True, remove_columns=dev.column_names)
    collator = DataCollatorForTokenClassification(tokenizer)
    if args.method == "rpp":  # posbias
        collator = posbias.hf.PositionShiftCollator(collator, model, tokenizer, method="rpp", mode=args.mode, seed=args.seed)
    elif args.method == "cp":  # posbias
        collator = posbias.hf.ContextPerturbationCollator(collator, model, tokenizer, max_len=args.cp_max_len,
                                                          mode=args.mode, seed=args.seed)

    training_args = TrainingArguments(
        output_dir=args.out, max_steps=args.max_steps, learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64, warmup_steps=args.max_steps // 10, weight_decay=0.01, eval_strategy="no", save_strategy="no",
        logging_steps=50, report_to="none", seed=args.seed)
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev, data_collator=collator)
    if args.k_max > 0:  # posbias: F1(alpha)
        posbias.hf.PositionBiasCallback(args.dev, tokenizer, k_max=args.k_max, quantiles=tuple(args.quantiles),
                                        length_pool=pool).attach(trainer)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(args.out)
    tokenizer.save_pretrained(args.out)
    # posbias: the saved folder is an ordinary HF model; score it on the whole dev file (seqeval F1)
    metrics["dev_f1"] = posbias.evaluate(args.out, args.dev, task="tagging", progress=False)["f1"]
    print(json.dumps(metrics, indent=2))
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
