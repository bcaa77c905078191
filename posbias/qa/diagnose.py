"""`posbias diagnose qa`: position analyses of any local QA model (posbias run or HF QA checkpoint)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from ..analysis.bias import NO_ANSWER
from ..checkpoint import load_checkpoint
from ..errors import ConfigError
from ..evaluation import eval_config, write_run_meta
from ..analysis.report import plot_update_fractions
from ..analysis.updates import PositionUpdateCounter
from ..analysis.verdict import (MIN_BUCKET, QUALITY_FLOOR, VERDICT_HEAD, merged_text, note, position_axis, quality,
                                quality_text, report_line, sentence, table_row, terminal_block)
from ..outputs import staged_output
from ..render import Document, data_label, md_escape, plot_text, pyplot, short_name
from ..utils import atomic_write_json
from . import metrics as M
from .answer_length import answer_length_labels
from .answer_sentence import answer_sentence_labels
from .evaluate import evaluate_checkpoint
from .positions import (first_x_labels, gold_mention_positions, predicted_start_positions,
                        quartile_labels)
from .readers import read_dataset


def _table(labels: dict[str, str], scores: dict[str, tuple[float, float]]) -> list[dict]:
    rows = []
    for label in sorted(set(labels.values())):
        q = [k for k, v in labels.items() if v == label and k in scores]
        rows.append({"segment": label, "questions": len(q),
                     "exact": 100 * float(np.mean([scores[k][0] for k in q])) if q else float("nan"),
                     "f1": 100 * float(np.mean([scores[k][1] for k in q])) if q else float("nan")})
    return rows


def _segments(doc: Document, rows: list[dict], title: str, min_size: int = MIN_BUCKET) -> None:
    """A segment table; segments under `min_size` questions are marked † (too few to read alone)."""
    doc.heading(md_escape(title), level=3)
    doc.table(["segment", "questions", "EM", "F1"],
              [[str(r["segment"]), f"{r['questions']}{' †' if r['questions'] < min_size else ''}", f"{r['exact']:.2f}",
                f"{r['f1']:.2f}"] for r in rows])


AXES = {"gold_position_quartile": "answer position", "answer_sentence": "answer sentence"}
"""Position axes of the verdict, headline first: the quarter of the window holding the gold answer
start (the absolute positions Random Padding studies), then the paragraph sentence holding it (Ko et
al. 2020)."""
SENTENCE_OPTIONS = {"gold_position_quartile": {"what": "answers"},
                    "answer_sentence": {"what": "answers", "prefix": "sentence "}}


def position_verdict(labels: dict[str, dict[str, str]], positions: dict[str, int], scores: dict, overall_f1: float,
                     *, min_size: int = MIN_BUCKET, samples: int = 2000, floor: float = QUALITY_FLOOR) -> dict:
    """The verdict block's content (`analysis.verdict`): per axis the sized front − rear effect, its
    trend and PSI, from per-question F1; the quality check of the overall F1.

    Args:
        labels: axis name (AXES) -> question id -> bucket ("no answer" questions left out here).
        positions: question id -> token position of its earliest gold answer start (the trend's x on
            the answer-position axis; the answer-sentence axis uses the sentence index).
        scores: question id -> (EM, F1) in 0..1.
    """
    f1 = {q: 100.0 * float(s[1]) for q, s in scores.items()}
    axes = {}
    for name in AXES:
        if name not in labels:
            continue
        lab = {q: b for q, b in labels[name].items() if b != NO_ANSWER}
        if name == "gold_position_quartile":
            axes[name] = position_axis(lab, f1, positions=positions, per=100, unit="token", name=AXES[name],
                                       min_size=min_size, samples=samples)
        else:
            axes[name] = position_axis(lab, f1, per=1, unit="sentence", name=AXES[name], min_size=min_size,
                                       samples=samples)
    first = next(iter(axes.values()), None)
    return {"evidence": first["evidence"] if first else "too few",
            "sentence": sentence(first, **SENTENCE_OPTIONS["gold_position_quartile"]) if first else "",
            "axes": axes, "quality": quality(overall_f1, floor, "F1"), "min_size": min_size, "samples": samples}


def _axes(bias: dict) -> list[tuple[str, dict | None, dict]]:
    return [(AXES[k], v, SENTENCE_OPTIONS[k]) for k, v in bias["axes"].items()]


def _bias_block(bias: dict, max_seq_len: int) -> tuple[str, list[str], list[list[str]], list[str]]:
    """The verdict: (headline sentence, table head, table body, notes); the quality warning is
    `quality_text(bias["quality"])`, shown apart (`Document.warning`). `max_seq_len`: the model's
    window, whose quarters the answer-position buckets are."""
    body = [table_row(AXES[k], v) for k, v in bias["axes"].items()]
    notes = [x for x in [merged_text(v) for v in bias["axes"].values()] if x]
    q1 = quartile_labels({"first": 0}, max_seq_len)["first"]  # "Q1 [0,96)" for 384-token windows
    end = _group_end(q1)
    notes.append(note(bias["min_size"], bias["samples"], " (questions resampled within each group)")
                 + f" Answer position: the quarter of the {max_seq_len}-token input window holding the earliest gold "
                 f"answer start ({q1} = tokens 0..{end - 1}), trend per 100 tokens of that start; answer sentence: "
                 "the paragraph sentence holding the first gold answer (Ko et al. 2020), trend per sentence. "
                 "\"no answer\" questions are left out.")
    return bias["sentence"], VERDICT_HEAD, body, notes


def verdict_lines(summary: dict, output_dir) -> list[str]:
    """The terminal's view of a QA diagnosis (`posbias diagnose qa`): the verdict and where the report is."""
    bias = summary["position_bias"]
    m = summary["metrics"]
    title = (f"Position bias of {short_name(summary['model'])} on {short_name(summary['data_name'])}: "
             f"{m['total']:,} questions, EM {m.get('exact_match', m.get('exact', float('nan'))):.1f}, "
             f"F1 {m['f1']:.1f}")
    return terminal_block(title, _axes(bias), bias["quality"], report_line(output_dir, len(summary["plots"])))


def equal_count_bins(x: np.ndarray, min_size: int = MIN_BUCKET, max_bins: int = 8) -> list[np.ndarray]:
    """Indices of `x` split into consecutive bins by position, each of >= `min_size` examples (as many
    bins as that allows, at most `max_bins`); equal positions never straddle two bins."""
    order = np.argsort(x, kind="stable")
    n = len(order)
    k = max(1, min(max_bins, n // max(1, min_size)))
    bins, start = [], 0
    for i in range(k):
        stop = n if i == k - 1 else min(n, max(round((i + 1) * n / k), start + min_size))
        while 0 < stop < n and x[order[stop]] == x[order[stop - 1]]:
            stop += 1  # keep ties together
        if stop > start:
            bins.append(order[start:stop])
        start = stop
    if len(bins) > 1 and len(bins[-1]) < min_size:  # a tail shortened by ties joins its neighbour
        bins[-2:] = [np.concatenate(bins[-2:])]
    return bins


def plot_position_curve(positions: dict[str, int], scores: dict, max_seq_len: int, path: Path, title: str = "",
                        min_size: int = MIN_BUCKET, axis: dict | None = None) -> Path:
    """F1 against the token position of the earliest gold answer start: bins of equal question
    counts (>= `min_size` each), each point at its bin's mean position with a 95% interval (mean ±
    1.96 standard errors) and its position range; the least-squares trend line; the front/rear
    boundary of the verdict (`axis`) as a dotted line."""
    plt = pyplot()
    qids = [q for q in positions if q in scores]
    x = np.array([positions[q] for q in qids], dtype=np.float64)
    y = np.array([100 * float(scores[q][1]) for q in qids])
    fig, ax = plt.subplots(figsize=(7, 3.8))
    if len(x):
        bins = equal_count_bins(x, min_size)
        cx = np.array([x[b].mean() for b in bins])
        cy = np.array([y[b].mean() for b in bins])
        se = np.array([y[b].std(ddof=1) / np.sqrt(len(b)) if len(b) > 1 else np.nan for b in bins])
        xerr = np.array([[cx[i] - x[b].min() for i, b in enumerate(bins)], [x[b].max() - cx[i] for i, b in enumerate(bins)]])
        ax.errorbar(cx, cy, yerr=1.96 * se, xerr=xerr, fmt="o", capsize=3, elinewidth=1, ms=4,
                    label="F1 of a bin (95% CI; bar: its positions)")
        for px, py, half, b in zip(cx, cy, 1.96 * se, bins):  # the count under each interval
            ax.annotate(f"n={len(b)}", (px, py - (0 if np.isnan(half) else half)), fontsize=7, ha="center", va="top",
                        xytext=(0, -3), textcoords="offset points")
        if np.ptp(x) > 0:
            slope, icpt = np.polyfit(x, y, 1)
            grid = np.array([x.min(), x.max()])
            t = (axis or {}).get("trend") or {}
            label = f"trend {100 * slope:+.1f} F1 / 100 tokens" + (
                f" [{t['ci'][0]:+.1f}, {t['ci'][1]:+.1f}]" if t.get("ci") else "")
            ax.plot(grid, icpt + slope * grid, color="tab:red", lw=1.2, label=label)
        rear = (axis or {}).get("rear")
        if rear:  # the front/rear boundary: where the rear group starts
            start = _group_start(rear["label"])
            if start is not None:
                ax.axvline(start, color="grey", ls=":", lw=1)
                ax.annotate("front | rear", (start, 0.02), xycoords=("data", "axes fraction"), fontsize=7,
                            ha="center", va="bottom", color="grey")
        ax.legend(fontsize=7, loc="best")
    ax.set_xlim(left=0, right=max_seq_len)
    ax.set_xlabel(f"token position of the earliest gold answer start (bins of >= {min_size} questions)")
    ax.set_ylabel("F1")
    ax.set_title(plot_text(title or "F1 by gold answer position"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _group_start(label: str) -> int | None:
    """First token of a quarter group label ("Q2–Q3 [96,288)" -> 96)."""
    m = re.search(r"\[(\d+),", label)
    return int(m.group(1)) if m else None


def _group_end(label: str) -> int | None:
    """The token after a quarter group label's last ("Q1 [0,96)" -> 96)."""
    m = re.search(r",(\d+)\)", label)
    return int(m.group(1)) if m else None


def plot_position_updates(updates: dict, path: Path, label: str = "") -> Path:
    return plot_update_fractions({label: PositionUpdateCounter.fractions(updates)}, path,
                                 f"Position-embedding updates ({updates['steps']} steps)")


def diagnose(model, data, output_dir, xs=(100,), overrides=None, progress: bool = True,
             bias_samples: int = 2000, min_bucket: int = MIN_BUCKET, quality_floor: float = QUALITY_FLOOR) -> dict:
    """Evaluate `model` on `data` and write position analyses into `output_dir`:
    diagnosis.md / .html / .json, first the verdict (`position_verdict`: the sized, signed front −
    rear effect along answer position and answer sentence with `bias_samples` bootstrap resamples,
    buckets under `min_bucket` questions merged, a warning under `quality_floor` F1), then F1 by
    answer-position quartile (gold and predicted, Table 1), S_X^(1) vs S_X^(2) for each X (App. C),
    EM/F1 by gold answer length (MaP Fig. 6) and by answer sentence (Ko et al. 2020), an
    F1-by-position plot and, for a posbias run, the position-embedding update plot (§2.3).
    The returned summary holds `verdict_lines`, what the terminal shows."""
    if isinstance(min_bucket, bool) or not isinstance(min_bucket, int) or min_bucket < 1:
        raise ConfigError(f"min_bucket must be a positive integer, got {min_bucket!r}")
    # Everything goes through a temporary folder, renamed when complete (`staged_output`).
    with staged_output(output_dir) as out:
        return _diagnose(model, data, out, Path(output_dir), xs, overrides, progress, bias_samples, min_bucket,
                         quality_floor)


def _diagnose(model, data, out: Path, final: Path, xs, overrides, progress, bias_samples: int = 2000,
              min_bucket: int = MIN_BUCKET, quality_floor: float = QUALITY_FLOOR) -> dict:
    """`diagnose`, writing into `out`, which becomes `final` when complete."""
    t0 = time.time()
    result = evaluate_checkpoint(model, data, out / "eval", overrides=overrides, progress=progress)
    _, tokenizer, mcfg = load_checkpoint(model, task="qa")
    cfg = eval_config(mcfg, overrides)
    ds = read_dataset(data, cfg.data.on_bad_record)
    if cfg.data.max_eval_examples:
        ds.examples = ds.examples[: cfg.data.max_eval_examples]
    preds = json.loads((out / "eval" / "predictions.json").read_text(encoding="utf-8"))
    nbest = json.loads((out / "eval" / "nbest.json").read_text(encoding="utf-8"))
    version = "2.0" if ds.has_impossible else "1.1"
    scores = M.per_question(ds.gold(), preds, version=version)
    d = cfg.data
    mentions = gold_mention_positions(ds.examples, tokenizer, max_seq_len=d.max_seq_len, stride=d.stride,
                                      max_query_len=d.max_query_len, context_first=d.context_first)
    starts = {q: min(p) for q, p in mentions.items() if p}
    gold_quartiles = quartile_labels(starts, d.max_seq_len)
    sentences = answer_sentence_labels(ds.examples)
    tables = {
        "gold_position_quartile": _table(gold_quartiles, scores),
        "pred_position_quartile": _table(quartile_labels(predicted_start_positions(nbest, preds), d.max_seq_len),
                                         scores),
    }
    # S_X (§6.1): a mention in the front X tokens of any window, not only of the first holding it.
    every = gold_mention_positions(ds.examples, tokenizer, max_seq_len=d.max_seq_len, stride=d.stride,
                                   max_query_len=d.max_query_len, context_first=d.context_first, windows="every")
    for x in xs:
        tables[f"first_x_tokens(x={x})"] = _table(first_x_labels(every, int(x)), scores)
    tables["answer_length"] = _table(answer_length_labels(ds.examples), scores)
    tables["answer_sentence"] = _table(sentences, scores)
    bias = position_verdict({"gold_position_quartile": gold_quartiles, "answer_sentence": sentences}, starts, scores,
                            result["f1"], min_size=min_bucket, samples=bias_samples, floor=quality_floor)
    data_name = data_label(data if isinstance(data, (str, Path, list, tuple)) else ds.path)
    name = f"{short_name(model)} on {short_name(data_name)}"
    plots = [("F1 by gold answer position", plot_position_curve(
        starts, scores, d.max_seq_len, out / "f1_by_position.png", f"F1 by answer position: {name}", min_bucket,
        bias["axes"].get("gold_position_quartile")))]
    run_dir = Path(model).parent
    if (run_dir / "position_updates.json").is_file():
        plots.append(("Position-embedding updates during training", plot_position_updates(
            json.loads((run_dir / "position_updates.json").read_text(encoding="utf-8")), out / "position_updates.png")))
    title = f"Position diagnosis of {model} on {data_name}"
    intro = [f"{result['total']} questions, {result['windows']} windows (max_seq_len {d.max_seq_len}, stride "
             f"{d.stride}): EM {result.get('exact_match', result.get('exact')):.2f}, "
             f"F1 {result['f1']:.2f}. Data: {data_label(ds.path)}.",
             "Positions are token indices in the input window ([CLS] = 0). Gold: the earliest gold mention "
             "(in the first window holding it). Predicted: the start of the predicted answer (the paper's Table 1). "
             f"S_X(1): a gold mention starts in the first X tokens of any window (§6.1). Segments marked † hold "
             f"fewer than {min_bucket} questions: too few to read alone."]
    headline, bias_head, bias_body, bias_notes = _bias_block(bias, d.max_seq_len)
    # The title and the intro name the user's model and file: escaped for Markdown.
    doc = Document(title)
    doc.heading("Position bias")
    doc.paragraph(f"**{headline}**")
    warning = quality_text(bias["quality"])
    if warning:  # above the tables it qualifies
        doc.warning(warning)
    doc.table(bias_head, bias_body)
    for x in bias_notes:
        doc.paragraph(x)
    doc.paragraph(md_escape(intro[0]))
    doc.paragraph(intro[1])
    titles = {"gold_position_quartile": "F1 by quarter of the window holding the gold answer start",
              "pred_position_quartile": "F1 by quarter of the window holding the predicted start (Table 1)",
              "answer_length": "EM/F1 by length of the shortest gold answer, in words (MaP Fig. 6)",
              "answer_sentence": "EM/F1 by the paragraph sentence holding the first gold answer (Ko et al. 2020)"}
    for x in xs:
        titles[f"first_x_tokens(x={x})"] = (f"EM/F1 by a gold answer in the first {x} tokens of a window, S{x}(1), "
                                            f"or only later, S{x}(2) (App. C)")
    for key, rows in tables.items():
        _segments(doc, rows, titles[key], min_bucket)
    doc.heading("Plots")
    doc.figures(plots)
    doc.write(out, "diagnosis")
    summary = {"position_bias": bias, "model": str(model), "data": ds.path, "data_name": str(data_name),
               "metrics": result, "tables": tables, "plots": [str(final / p.name) for _, p in plots]}
    summary["verdict_lines"] = verdict_lines(summary, final)
    atomic_write_json(out / "diagnosis.json", summary)
    write_run_meta(out, cfg, "diagnose qa", model, ds.path, t0, skipped=ds.skipped)
    return summary
