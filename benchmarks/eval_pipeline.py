"""Windows/s of `evaluate qa`'s host pipeline alone: the whole call with a null model (issue 61 item 6).

A GPU runs MiniLM's forward on 384-token windows at ~2,700 windows/s; whatever the host does per
window besides (reading the file, tokenizing, building windows, collating, decoding the n-best
spans into answers, the SQuAD metrics) must keep up. This script runs exactly the code path of
`posbias evaluate qa` (`posbias.qa.evaluate.evaluate_dataset` on `read_dataset`'s dataset, with the
run config `evaluate` builds) with a NULL MODEL in place of the encoder: its start/end logits are a
cheap hash of each token's id and position (deterministic, different per token, so the decoder
has real choices to make), so only the host pipeline is measured. CPU, one thread.

Reported: windows/s of the whole call (median of `--repeats`, read included), the same without
the read, and the stages of one more run under cProfile (their share of its time: cProfile slows
Python-heavy stages more than others, so shares, not seconds, are the measure).

With `--base PATH` (another posbias checkout, e.g. `cp -r posbias /tmp/base/`) the repeats of the
two alternate (base, current, base, current, ...), so both see the same load of a shared machine,
and the predictions, n-best lists and metrics of the two are compared to the character.

Usage:
    python benchmarks/eval_pipeline.py [--data $POSBIAS_SHARED_DATA/squad_v1.1/dev-v1.1.json.gz]
        [--repeats 3] [--base OLD_CHECKOUT] [--limit N]
Prints a Markdown block; writes bench/out/eval_pipeline/<timestamp>.json. The published numbers are in
benchmarks/results/eval_pipeline.json (the site's Performance page is generated from it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SQUAD_DEV = ROOT.parent / "shared" / "data" / "squad_v1.1" / "dev-v1.1.json.gz"

# Stage -> the functions whose cumulative time it is (by name, base and current code alike); a
# stage's own time excludes the stages listed before it that run inside it.
STAGES = {
    "read": ("read_dataset",),
    "tokenize": ("_encode", "_truncate_questions", "tokens_of"),
    "windows": ("eval_windows", "select", "take", "eval_features"),
    "collate": ("collate",),
    "forward": ("null_forward",),
    "decode": ("batch_candidates", "candidate_chars", "decode"),
    "metrics": ("score_predictions", "check_ranges"),
}


def null_model():
    """A QA model with no encoder: start/end logits hashed from each token's id and position."""
    import torch
    from torch import nn

    from posbias.qa.heads.independent import IndependentHead
    from posbias.qa.heads.span_scores import masked_logits

    class NullQAModel(nn.Module):
        null_answer = False

        def __init__(self):
            super().__init__()
            self.head = IndependentHead(1)  # decoding's protocol (top_spans); its weights are unused

        def forward(self, batch: dict, targets=None) -> dict:
            return null_forward(batch)

    def null_forward(batch: dict) -> dict:
        ids = batch["input_ids"]  # (b, s)
        pos = torch.arange(ids.shape[1]) - batch["pad_left"][:, None]  # (b, s) unpadded positions
        start = ((ids * 7919 + pos * 104729) % 10007).float() / 10007  # (b, s)
        end = ((ids * 6151 + pos * 3571 + 17) % 10009).float() / 10009  # (b, s)
        mask = batch["span_mask"]
        return {"start_logits": masked_logits(start, mask), "end_logits": masked_logits(end, mask)}

    return NullQAModel()


def one_run(data: str, limit: int | None, profile: bool, save: str | None) -> dict:
    """One `evaluate qa` call (read + evaluate_dataset) with the null model, in this process."""
    import torch

    from posbias.config import build_config
    from posbias.encoders import load_tokenizer
    from posbias.qa import evaluate as qa_eval
    from posbias.qa.readers import read_dataset

    torch.set_num_threads(1)
    cfg = build_config({"model": {"name_or_path": "minilm"}})
    tok = load_tokenizer(cfg.model)
    model = null_model()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    ds = read_dataset(data, cfg.data.on_bad_record)
    if limit:
        ds.examples = ds.examples[:limit]
    t1 = time.perf_counter()
    out = Path(save) if save else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    result = qa_eval.evaluate_dataset(model, tok, cfg, ds, out, progress=False)
    t2 = time.perf_counter()
    if prof is not None:
        prof.disable()
    run = {"posbias": str(Path(qa_eval.__file__).parents[1]), "windows": result["windows"], "examples": len(ds.examples), "seconds": t2 - t0,
           "seconds_without_read": t2 - t1, "f1": result["f1"], "exact_match": result["exact_match"]}
    if prof is not None:
        run["stages"] = stage_times(prof)
    return run


def stage_times(prof) -> dict:
    """Seconds per stage from a cProfile run: the time spent in the stage's functions, counted over
    the calls that come from outside the stage (so a stage function called by another of the same
    stage counts once); `windows` less the tokenizer calls made while building windows."""
    import pstats

    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    raw = {}
    for stage, names in STAGES.items():
        total = 0.0
        for (file, _, name), (_, _, _, ct, callers) in stats.items():
            if name not in names or ("posbias" not in file and name != "null_forward"):
                continue
            # callers: caller -> (nc, cc, tt, ct) of the calls from that caller; none for calls from
            # the frame that started the profiler (`one_run`)
            total += sum(edge[3] for caller, edge in callers.items() if caller[2] not in names) if callers else ct
        raw[stage] = total
    raw["windows"] = max(0.0, raw["windows"] - raw["tokenize"])
    whole = sum(v[3] for k, v in stats.items() if k[2] in ("evaluate_dataset", "read_dataset"))
    raw["other"] = max(0.0, whole - sum(raw.values()))
    return {"profiled_seconds": round(whole, 3), **{k: round(v, 3) for k, v in raw.items()}}


def child(code: Path, args, profile: bool, save: str | None) -> dict:
    """`one_run` in a fresh process with posbias imported from `code`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(code)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--data", args.data]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if profile:
        cmd.append("--profile")
    if save:
        cmd += ["--save", save]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"run failed ({code}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[2:])


def same_outputs(a: Path, b: Path) -> dict:
    names = ("predictions.json", "nbest.json", "metrics.json")
    return {n: (a / n).read_bytes() == (b / n).read_bytes() for n in names}


def summary(runs: list[dict]) -> dict:
    wps = [r["windows"] / r["seconds"] for r in runs]
    wps_eval = [r["windows"] / r["seconds_without_read"] for r in runs]
    return {"windows": runs[0]["windows"], "examples": runs[0]["examples"],
            "windows_per_s": round(statistics.median(wps), 1), "windows_per_s_all": [round(x, 1) for x in wps],
            "windows_per_s_without_read": round(statistics.median(wps_eval), 1),
            "seconds": round(statistics.median(r["seconds"] for r in runs), 3), "f1": runs[0]["f1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SQUAD_DEV))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, help="first N questions only")
    ap.add_argument("--base", help="another posbias checkout to measure the same way (before)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("@@" + json.dumps(one_run(args.data, args.limit, args.profile, args.save)), flush=True)
        return

    sys.path.insert(0, str(ROOT))
    from posbias.utils import cpu_name, now_iso, versions

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = ROOT / "bench" / "out" / "eval_pipeline" / stamp
    codes = {"current": ROOT} if not args.base else {"before": Path(args.base).resolve(), "after": ROOT}
    runs: dict[str, list] = {k: [] for k in codes}
    for r in range(args.repeats):
        for name, code in codes.items():  # alternating: both see the same load
            save = str(out / name) if r == 0 else None
            runs[name].append(child(code, args, False, save))
            print(f"  {name} repeat {r + 1}: {runs[name][-1]['windows'] / runs[name][-1]['seconds']:.0f} windows/s",
                  file=sys.stderr, flush=True)
    result = {"date": now_iso(), "cpu": cpu_name(), "cores": os.cpu_count(), "threads": 1,
              "load_average": os.getloadavg(), "data": args.data, "limit": args.limit,
              "tokenizer": "minilm", "versions": versions(), "repeats": args.repeats,
              "command": "python benchmarks/eval_pipeline.py " + " ".join(sys.argv[1:]),
              "results": {k: summary(v) for k, v in runs.items()}, "runs": runs}
    if not args.no_profile:
        for name, code in codes.items():
            result["results"][name]["stages"] = child(code, args, True, None)["stages"]
    if args.base:
        result["identical_outputs"] = same_outputs(out / "before", out / "after")
        # Ratio of the repeats run back to back (before r, after r), median over r.
        result["ratio_after_before"] = round(statistics.median(
            (x["seconds"] / y["seconds"]) for x, y in zip(runs["before"], runs["after"])), 2)
        result["results"]["before"]["code"], result["results"]["after"]["code"] = args.base, "this checkout"
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    print(f"\nwritten {out / 'result.json'}", file=sys.stderr)


def markdown(result: dict) -> str:
    rows = ["| code | windows | windows/s (whole call) | windows/s (without read) | F1 |", "|---|---:|---:|---:|---:|"]
    for name, r in result["results"].items():
        rows.append(f"| {name} | {r['windows']:,} | {r['windows_per_s']:,.0f} | {r['windows_per_s_without_read']:,.0f} "
                    f"| {r['f1']:.2f} |")
    v = result["versions"]
    lines = [f"- **Command:** `{result['command']}`",
             (f"- **Hardware:** {result['cpu']}, {result['cores']} cores, 1 thread; load average "
              f"{result['load_average'][0]:.1f} (shared machine)"),
             (f"- **Date:** {result['date']}; torch {v.get('torch')}, tokenizers {v.get('tokenizers')}, "
              f"transformers {v.get('transformers')}"),
             f"- **Median of {result['repeats']} repeats**", "", *rows]
    if "ratio_after_before" in result:
        lines += ["", (f"after/before speed, repeats run back to back: **{result['ratio_after_before']}x**; "
                       f"identical outputs: {result['identical_outputs']}")]
    staged = {k: r["stages"] for k, r in result["results"].items() if "stages" in r}
    if staged:
        names = [s for s in next(iter(staged.values())) if s != "profiled_seconds"]
        lines += ["", "Share of the profiled run (cProfile) per stage:", "",
                  "| code | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for k, st in staged.items():
            tot = st["profiled_seconds"] or 1.0
            lines.append(f"| {k} | " + " | ".join(f"{100 * st[n] / tot:.0f}%" for n in names) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
