"""Speed of the duplicated-test-set evaluation (`posbias diagnose tagging`, F1(α) for k = 1..10).

The forward workload of D*_test(k), k = 1..K, is about K(K+1)/2 times one evaluation of D*_test.
This measures, on a trained MiniLM tagger and the CoNLL-2003 D* test set:
  posbias      position_eval in duplicate mode (tokenize once, duplicate ids, all (k, sentence)
               inputs sorted by length, token-budget batches, strict scoring of every (k, α) cell)
  bare         the bare encoder's forward (AutoModel, no head, no scoring) on exactly the batches
               posbias ran, recorded during its run
  naive        the authors' approach, for scale: for each k separately, the duplicated word lists
               re-tokenized with the tokenizer and run in file order in batches of 64
Real (non-padding) tokens/s of each, and the ratios posbias / bare (target >= 0.9) and
posbias / naive.

Usage:
    python benchmarks/position_eval.py --model <tagging checkpoint> [--data shared:conll2003/test.txt]
        [--k-max 10] [--repeats 1] [--skip-naive]
Writes bench/out/position_eval/<timestamp>/result.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posbias.checkpoint import load_checkpoint  # noqa: E402
from posbias.evaluation import eval_config  # noqa: E402
from posbias.tagging.duplicated import length_subset, position_eval  # noqa: E402
from posbias.tagging.inputs import read_for  # noqa: E402
from posbias.utils import versions  # noqa: E402


class Recorder:
    """Wraps the encoder's forward: records every batch it sees (for the bare re-run)."""

    def __init__(self, encoder):
        self.encoder, self.batches = encoder, []
        self.forward = encoder.forward

    def __call__(self, **kwargs):
        self.batches.append({k: v.clone() for k, v in kwargs.items() if torch.is_tensor(v)})
        return self.forward(**kwargs)


def bare_forward(encoder, batches) -> tuple[float, int]:
    """Seconds and real tokens of the bare encoder forward over `batches`."""
    seconds, tokens = 0.0, 0
    with torch.inference_mode():
        for b in batches:
            t0 = time.perf_counter()
            encoder(**b)
            seconds += time.perf_counter() - t0
            tokens += int(b["attention_mask"].sum())
    return seconds, tokens


def naive(net, tokenizer, examples, k_max: int, batch_size: int = 64) -> tuple[float, int]:
    """Per k: duplicate the words with the separator token as a word, re-tokenize, run in file
    order (padding to the longest of each batch of 64); argmax of the logits. The authors' shape."""
    sep = tokenizer.sep_token or tokenizer.eos_token
    seconds, tokens = 0.0, 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for k in range(1, k_max + 1):
            words = [sum(([*e.words, sep] for _ in range(k)), [])[:-1] for e in examples]
            for b in range(0, len(words), batch_size):
                enc = tokenizer(words[b:b + batch_size], is_split_into_words=True, padding=True, return_tensors="pt",
                                truncation=True, max_length=512)
                net({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})["logits"].argmax(-1)
                tokens += int(enc["attention_mask"].sum())
    seconds = time.perf_counter() - t0
    return seconds, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a trained tagging checkpoint (posbias or Hugging Face)")
    ap.add_argument("--data", default="shared:conll2003/test.txt")
    ap.add_argument("--k-max", type=int, default=10)
    ap.add_argument("--batch-tokens", type=int, default=16_384)
    ap.add_argument("--repeats", type=int, default=1, help="timed repetitions (median)")
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    net, tok, mcfg = load_checkpoint(args.model, task="tagging")
    net.eval()
    ds = read_for(args.data, eval_config(mcfg, None))
    runs = []
    for rep in range(args.repeats):
        rec = Recorder(net.encoder)
        net.encoder.forward = rec
        t0 = time.perf_counter()
        res = position_eval(net, tok, ds, k_max=args.k_max, modes=("duplicate",), batch_tokens=args.batch_tokens,
                            progress=False)
        wall = time.perf_counter() - t0
        net.encoder.forward = rec.forward
        real = res["timing"]["real_tokens"]
        b_sec, b_tok = bare_forward(net.encoder, rec.batches)
        assert b_tok == real, (b_tok, real)
        padded = sum(int(b["input_ids"].numel()) for b in rec.batches)
        runs.append({"wall_seconds": wall, "real_tokens": real, "padded_tokens": padded, "batches": len(rec.batches),
                     "tokens_per_s": real / wall, "bare_seconds": b_sec, "bare_tokens_per_s": real / b_sec,
                     "ratio_vs_bare": b_sec / wall})
        print(json.dumps(runs[-1]), flush=True)
    med = lambda k: float(np.median([r[k] for r in runs]))  # noqa: E731
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
           "torch_threads": torch.get_num_threads(), "versions": versions(), "args": vars(args),
           "subset": res["subset"], "runs": runs, "summary": res["summary"],
           "median": {k: med(k) for k in ("wall_seconds", "tokens_per_s", "bare_tokens_per_s", "ratio_vs_bare")}}
    one_eval = sum(len(tok(e.words, is_split_into_words=True)["input_ids"])
                   for e in length_subset(ds.examples)[0])
    out["workload_vs_one_eval"] = runs[0]["real_tokens"] / one_eval
    if not args.skip_naive:
        sub = length_subset(ds.examples)[0]
        sec, toks = naive(net, tok, sub, args.k_max)
        out["naive"] = {"seconds": sec, "real_tokens": toks, "tokens_per_s": toks / sec,
                        "speedup_posbias_vs_naive": sec / out["median"]["wall_seconds"]}
        print(json.dumps(out["naive"]), flush=True)
    path = ROOT / "bench" / "out" / "position_eval" / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    (path / "result.json").write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    print(json.dumps(out["median"], indent=1))
    print(f"wrote {path / 'result.json'}")


if __name__ == "__main__":
    main()
