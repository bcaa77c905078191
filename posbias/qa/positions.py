"""Answer-position analyses (Random Padding paper §2.3 Table 1, §6.1 + App. C, §6.2).

Positions are token indices in the model's input window ([CLS] = 0, question first), the axis the
absolute position embeddings see. A question's gold position (quartiles) is that of its earliest
gold mention in the first window that holds it; S_X^(1) holds the questions with a gold mention in
the front X tokens of any of their windows (§6.1); the predicted position is the start token of the
answer.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..analysis.stats import mean_std
from ..checkpoint import load_checkpoint
from ..config import DEFAULT_TASK
from ..registry import SEGMENTERS
from .examples import QAExample
from .features import _label_tokens, build_qa_features
from .metrics import f1 as f1_score, normalize_answer
from .readers import read_dataset


WINDOWS = ("first", "every")


def gold_mention_positions(examples: list[QAExample], tokenizer, *, max_seq_len: int, stride: int,
                           max_query_len: int = 64, context_first: str = "auto",
                           windows: str = "first") -> dict[str, list[int]]:
    """Question id -> start token position of every gold mention.

    windows: `first` — one position per mention, in the first window holding it (the gold position
        quartile, the F1-by-position curve); `every` — one per (mention, window holding it): a
        mention that a stride repeats counts at each place a window shows it (S_X, §6.1).
    """
    if windows not in WINDOWS:
        raise ValueError(f"windows must be one of {list(WINDOWS)}, got {windows!r}")
    feats = build_qa_features(examples, tokenizer, max_seq_len=max_seq_len, stride=stride,
                              max_query_len=max_query_len, context_first=context_first, train=False)
    out: dict[str, list[int]] = {e.id: [] for e in examples}
    seen: set[tuple[str, int]] = set()
    for w in range(len(feats)):
        e = examples[feats.example_index[w]]
        for k, a in enumerate(e.answers):
            if windows == "first" and (e.id, k) in seen:
                continue  # the first window holding the mention decides its position
            span = _label_tokens(feats.offsets[w], a.start, a.end)
            if span is not None:
                seen.add((e.id, k))
                out[e.id].append(span[0])
    return out


def quartile_labels(positions: dict[str, int | None], max_seq_len: int) -> dict[str, str]:
    """Label each question with the quarter of [0, max_seq_len) its position falls in (Table 1)."""
    q = max_seq_len / 4
    out = {}
    for qid, p in positions.items():
        if p is None:
            continue
        i = min(int(p // q), 3)
        out[qid] = f"Q{i + 1} [{int(i * q)},{int((i + 1) * q)})"
    return out


def first_x_labels(mentions: dict[str, list[int]], x: int) -> dict[str, str]:
    """S_X^(1): at least one gold mention starts within the first X tokens of an input window; S_X^(2):
    all start later (§6.1, App. C: 0..X vs X+1..512). Questions with no locatable mention are left
    out. `mentions` should hold every window's positions (`gold_mention_positions(windows="every")`):
    §6.1 asks whether an answer "is located in the front X tokens of the input sequence", and a
    question whose mention sits at the rear of its first window but in the front of the next one
    (stride) can be answered at a front position."""
    return {qid: (f"S{x}(1)" if min(ps) <= x else f"S{x}(2)") for qid, ps in mentions.items() if ps}


def predicted_start_positions(nbest: dict[str, list[dict]], predictions: dict[str, str]) -> dict[str, int | None]:
    """Question id -> start token of the predicted answer (None for a null/absent answer)."""
    out = {}
    for qid, text in predictions.items():
        top = next((c for c in nbest.get(qid, []) if c["text"] == text and c["token_start"] >= 0), None)
        out[qid] = top["token_start"] if top and text else None
    return out


def _checkpoint_setup(checkpoint):
    _, tokenizer, cfg = load_checkpoint(checkpoint, task="qa")
    return tokenizer, cfg


@SEGMENTERS.register("gold_position_quartile")
def gold_position_quartile(examples, eval_dir, checkpoint, **options):
    """Quarter of the input window where the earliest gold mention starts."""
    tokenizer, cfg = _checkpoint_setup(checkpoint)
    d = cfg.data
    mentions = gold_mention_positions(examples, tokenizer, max_seq_len=d.max_seq_len, stride=d.stride,
                                      max_query_len=d.max_query_len, context_first=d.context_first)
    return quartile_labels({q: min(p) if p else None for q, p in mentions.items()}, d.max_seq_len)


@SEGMENTERS.register("pred_position_quartile")
def pred_position_quartile(examples, eval_dir, checkpoint, **options):
    """Quarter of the input window where the predicted answer starts (the paper's Table 1 split)."""
    _, cfg = _checkpoint_setup(checkpoint)
    nbest = json.loads((Path(eval_dir) / "nbest.json").read_text(encoding="utf-8"))
    preds = json.loads((Path(eval_dir) / "predictions.json").read_text(encoding="utf-8"))
    return quartile_labels(predicted_start_positions(nbest, preds), cfg.data.max_seq_len)


@SEGMENTERS.register("first_x_tokens")
def first_x_tokens(examples, eval_dir, checkpoint, x: int = 100, **options):
    """S_X^(1) / S_X^(2) of App. C, X in tokens of the input window."""
    tokenizer, cfg = _checkpoint_setup(checkpoint)
    d = cfg.data
    mentions = gold_mention_positions(examples, tokenizer, max_seq_len=d.max_seq_len, stride=d.stride,
                                      max_query_len=d.max_query_len, context_first=d.context_first,
                                      windows="every")
    return first_x_labels(mentions, int(x))


# Segments that depend on the gold answers only: the same questions for every method, so the report
# can pair methods question by question within a segment (the bootstrap).
gold_position_quartile.gold_only = True
first_x_tokens.gold_only = True


# ------------------------------------------------------------------------- improvement categories
def improvement_categories(gold: dict[str, list[str]], baseline: dict[str, str], method: dict[str, str]) -> dict:
    """§6.2: among questions where the method's F1 beats the baseline's, the share of corrections
    (the two predictions share no token: a different answer) vs more precise boundaries (they share
    tokens: the same answer, better cut)."""
    improved = corrections = 0
    for qid, golds in gold.items():
        b, m = baseline.get(qid, ""), method.get(qid, "")
        fb = max((f1_score(b, g) for g in golds), default=0.0)
        fm = max((f1_score(m, g) for g in golds), default=0.0)
        if fm <= fb:
            continue
        improved += 1
        if not set(normalize_answer(b).split()) & set(normalize_answer(m).split()):
            corrections += 1
    return {"improved": improved, "corrections": corrections, "boundaries": improved - corrections,
            "correction_share": corrections / improved if improved else float("nan"),
            "boundary_share": (improved - corrections) / improved if improved else float("nan")}


def improvement_rows(results: dict) -> list[dict]:
    """§6.2 per method x eval set: among the questions where the method beats the baseline (paired
    by seed), the share of corrections vs more precise boundaries; mean ± std over seeds."""
    runs = [r for r in results["runs"] if r["status"] == "finished" and
            json.loads(r["config_json"]).get("task", DEFAULT_TASK) == "qa"]
    base = results["baseline"]
    eval_sets = results["spec"].get("eval_sets") or {}
    gold_cache: dict = {}

    def predictions(run, eval_set):
        folder = Path(run["output_dir"]) / ("eval" if eval_set == "val" else f"evals/{eval_set}")
        path = folder / "predictions.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def gold(run, eval_set):
        cfg = json.loads(run["config_json"])
        spec = cfg["data"]["eval_file"] if eval_set == "val" else eval_sets.get(eval_set)
        key = (json.dumps(spec), eval_set == "val" and cfg["data"]["max_eval_examples"])
        if key not in gold_cache:
            ds = read_dataset(spec)
            if eval_set == "val" and cfg["data"]["max_eval_examples"]:
                ds.examples = ds.examples[: cfg["data"]["max_eval_examples"]]
            gold_cache[key] = ds.gold()
        return gold_cache[key]

    rows = []
    cells: dict = {}
    for r in runs:
        for eval_set in r["metrics"]:
            cells.setdefault((r["dataset"], r["train_size"], eval_set), {}).setdefault(r["method"], {})[r["seed"]] = r
    for (dataset, size, eval_set), by_method in sorted(cells.items(), key=lambda kv: str(kv[0])):
        if base not in by_method:
            continue
        for method in [m for m in results["methods"] if m in by_method and m != base]:
            shares, counts = [], []
            for seed, run in by_method[method].items():
                b = by_method[base].get(seed)
                pm, pb = predictions(run, eval_set), predictions(b, eval_set) if b else None
                if pm is None or pb is None:
                    continue
                c = improvement_categories(gold(run, eval_set), pb, pm)
                if c["improved"]:
                    shares.append(100 * c["boundary_share"])
                    counts.append(c["improved"])
            if shares:
                m, s = mean_std(shares)
                rows.append({"dataset": dataset, "train_size": size, "eval_set": eval_set, "method": method,
                             "seeds": len(shares), "improved_mean": float(np.mean(counts)),
                             "boundary_share_mean": m, "boundary_share_std": s})
    return rows
