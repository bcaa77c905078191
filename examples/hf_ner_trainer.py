"""A standard Hugging Face Trainer NER fine-tune, plus posbias: a position-bias mitigation (RPP or
Context Perturbation) as a data collator, and F1(alpha) on duplicated test sets at every evaluation.

    python examples/hf_ner_trainer.py --model bert-base-cased --train train.conll --dev dev.conll \
        --out runs/hf_ner --method rpp

Everything but the lines marked `posbias` is the usual script; drop them for the plain baseline.
"""
import argparse
import json

from datasets import Dataset
from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification, Trainer,
                          TrainingArguments)

import posbias  # posbias
import posbias.hf  # posbias
from posbias.tagging.readers import read_tagging  # CoNLL / CoNLL-U reader (any words + tags source works)


def load(path):
    ds = read_tagging(path)
    return Dataset.from_dict({"tokens": [e.words for e in ds.examples], "tags": [e.tags for e in ds.examples]})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="Hub id or local folder of an encoder")
    ap.add_argument("--train", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", choices=["none", "rpp", "cp"], default="rpp")
    ap.add_argument("--mode", choices=["replace", "augment"], default="augment", help="augment: the authors' clean + perturbed step")
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--cp-max-len", type=int, default=None, help="CP's M (default: the model's position table)")
    ap.add_argument("--k-max", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)

    train, dev = load(args.train), load(args.dev)
    labels = sorted({t for tags in train["tags"] for t in tags})
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})

    def encode(batch):
        enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=args.max_length)
        enc["labels"] = []
        for i, tags in enumerate(batch["tags"]):
            prev, row = None, []
            for w in enc.word_ids(i):  # the first sub-token of each word carries its label
                row.append(-100 if w is None or w == prev else labels.index(tags[w]))
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
    posbias.hf.PositionBiasCallback(args.dev, tokenizer, k_max=args.k_max).attach(trainer)  # posbias: F1(alpha)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(args.out)
    tokenizer.save_pretrained(args.out)
    # posbias: the saved folder is an ordinary HF model; score it on the whole dev file (seqeval F1)
    metrics["dev_f1"] = posbias.evaluate(args.out, args.dev, task="tagging", progress=False)["f1"]
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
