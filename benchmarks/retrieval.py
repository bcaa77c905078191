"""Retrieval position bias of the bundled MiniLM on SQuAD v1.1 dev (issue 48), and the speed of
`posbias diagnose retrieval`'s embedding against the bare encoder's forward on the same passages.

1. `posbias.diagnose_retrieval("minilm", SQuAD dev)`: every answerable question against the 2,067
   passages, by SQuAD-PosQ's character buckets and by tokens, BM25 and best-chunk (max-sim) beside the
   single vector, and the paired start/middle/end documents. Writes the diagnosis folder.
2. Speed: the passages embedded by posbias (sentence-transformers' encode in length-sorted batches,
   under the same precision) against the bare encoder forward (`model[0].auto_model`, no pooling)
   on the same tokenized passages in the same length-sorted batches. Medians of `--repeats` passes,
   in one process; target: posbias >= 0.9 of the bare forward's passages/s.

    python benchmarks/retrieval.py [--data ../shared/data/squad_v1.1/dev-v1.1.json.gz] [--repeats 3] [--cache-dir D]

Writes bench/out/retrieval/<timestamp>/ (diagnosis files and bench.json) and prints the numbers.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bare_forward_seconds(embedder, passages: list[str], batch_size: int) -> float:
    """Seconds of the bare transformer forward over `passages` in posbias's batches: the same
    tokenization (max length, truncation), the same length-sorted order and precision, no pooling."""
    import numpy as np
    import torch

    from posbias.precision import autocast

    enc_model = embedder.model[0].auto_model if embedder.kind == "sentence-transformers" else embedder.model
    order = np.argsort([-len(t) for t in passages], kind="stable")
    batches = []
    for lo in range(0, len(passages), batch_size):
        texts = [passages[i] for i in order[lo:lo + batch_size]]
        batches.append(embedder.tokenizer(texts, padding=True, truncation=True, max_length=embedder.max_length,
                                          return_tensors="pt"))
    t = time.perf_counter()
    with torch.inference_mode(), autocast(embedder.device, embedder.precision):
        for b in batches:
            enc_model(**{k: v.to(embedder.device) for k, v in b.items()})
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "squad_v1.1" / "dev-v1.1.json.gz"))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cache-dir", default=None, help="embeddings of an earlier diagnosis (the speed part never uses it)")
    args = ap.parse_args()

    import torch

    import posbias
    from posbias.qa.readers import read_dataset
    from posbias.retrieval.benchmark import from_examples
    from posbias.retrieval.embed import load_embedder
    from posbias.utils import cpu_name, versions

    out = Path(args.out or ROOT / "bench" / "out" / "retrieval" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = posbias.diagnose_retrieval(args.model, args.data, out / "diagnosis", progress=False, cache_dir=args.cache_dir)
    diag_s = time.time() - t0
    print("\n".join(res["verdict_lines"]))

    embedder = load_embedder(args.model)
    passages = from_examples(read_dataset(args.data).examples).passages
    embedder.encode(passages[:64], "document", batch_size=args.batch_size)  # warm-up
    ours, bare = [], []
    for _ in range(args.repeats):  # alternate, so that drift on a shared machine hits both alike
        t = time.perf_counter()
        embedder.encode(passages, "document", batch_size=args.batch_size)
        ours.append(time.perf_counter() - t)
        bare.append(bare_forward_seconds(embedder, passages, args.batch_size))
    speed = {"passages": len(passages), "posbias_encode_s": statistics.median(ours),
             "bare_forward_s": statistics.median(bare), "all_posbias_s": ours, "all_bare_s": bare}
    speed["ratio_passages_per_s"] = speed["bare_forward_s"] / speed["posbias_encode_s"]
    record = {"diagnosis_seconds": round(diag_s, 1), "speed": speed, "cpu": cpu_name(),
              "threads": torch.get_num_threads(), "versions": versions(), "model": embedder.describe(),
              "overall": res["overall"], "paired": res["paired"], "axes": {k: {x: v.get(x) for x in (
                  "effect", "ci", "psi", "psi_ci", "evidence")} for k, v in res["axes"].items()},
              "char_buckets": res["char_buckets"], "answers_beyond_window": res["answers_beyond_window"]}
    (out / "bench.json").write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    print(f"diagnosis {diag_s:.0f} s; passages embedded by posbias {speed['posbias_encode_s']:.1f} s vs bare forward "
          f"{speed['bare_forward_s']:.1f} s: {speed['ratio_passages_per_s']:.2f} of the bare forward's speed "
          f"({torch.get_num_threads()} threads, {cpu_name()}); {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
