"""`posbias diagnose qa`: position analyses of any local QA model (posbias run or HF QA checkpoint)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..analysis.updates import PositionUpdateCounter
from .answer_length import answer_length_labels
from .answer_sentence import answer_sentence_labels
from .positions import (first_x_labels, gold_mention_positions, predicted_start_positions,
                        quartile_labels)


def _table(labels: dict[str, str], scores: dict[str, tuple[float, float]]) -> list[dict]:
    rows = []
    for label in sorted(set(labels.values())):
        q = [k for k, v in labels.items() if v == label and k in scores]
        rows.append({"segment": label, "questions": len(q),
                     "exact": 100 * float(np.mean([scores[k][0] for k in q])) if q else float("nan"),
                     "f1": 100 * float(np.mean([scores[k][1] for k in q])) if q else float("nan")})
    return rows


def _md(rows: list[dict], title: str) -> list[str]:
    out = [f"### {title}", "", "| segment | questions | EM | F1 |", "|---|---|---|---|"]
    out += [f"| {r['segment']} | {r['questions']} | {r['exact']:.2f} | {r['f1']:.2f} |" for r in rows]
    return out + [""]


BIAS_TITLES = {"gold_position_quartile": "gold position quartile", "answer_sentence": "answer sentence"}


def _bias_block(bias: dict) -> tuple[list[str], list[list[str]], str]:
    """The "Position bias" table (head, body) and its note, from `analysis.bias.qa_position_bias`."""
    head = ["bucketing", "buckets", "questions", "drop = best − worst F1 [95% CI]", "PSI = 1 − worst/best [95% CI]"]
    body = []
    for name, b in bias.items():
        if b is None:
            body.append([BIAS_TITLES.get(name, name), "< 2", "–", "–", "–"])
            continue
        ci = lambda c, d: f" [{c[0]:.{d}f}, {c[1]:.{d}f}]" if c else ""  # noqa: E731
        body.append([BIAS_TITLES.get(name, name), str(b["buckets"]), str(b["questions"]),
                     f"{b['drop']:.2f}{ci(b['drop_ci'], 2)} ({b['best']} vs {b['worst']})",
                     f"{b['psi']:.3f}{ci(b['psi_ci'], 3)}"])
    samples = next((b["samples"] for b in bias.values() if b), 0)
    note = ("Drop: F1 of the best bucket minus the worst, in points; PSI, the position sensitivity index: 0 = no "
            "position effect, 1 = a bucket at F1 0. Buckets: the quarter of the window holding the gold answer "
            "start, and the paragraph sentence holding the first gold answer (Ko et al. 2020); \"no answer\" "
            "questions are left out. "
            + (f"95% intervals: percentile bootstrap over questions resampled within each bucket ({samples:,} "
               "resamples, seed 0). The drop and PSI compare the best and worst of noisy bucket means, so "
               "resampling biases them upwards: where buckets score alike, an interval can lie above its point "
               "value." if samples else "No intervals (0 bootstrap resamples)."))
    return head, body, note


def _html(title: str, intro: list[str], tables: dict, titles: dict, plots: list[Path], bias: dict) -> str:
    """The diagnosis as one self-contained page (plots embedded), the same content as diagnosis.md."""
    import html

    from ..analysis.report import html_figure, html_page, html_table

    head, body, note = _bias_block(bias)
    parts = [f"<h1>{html.escape(title)}</h1>", "<h2>Position bias</h2>", html_table(head, body),
             f"<p>{html.escape(note)}</p>"]
    parts += [f"<p>{html.escape(x)}</p>" for x in intro if x]
    for name, rows in tables.items():
        parts.append(f"<h2>{html.escape(titles.get(name, name))}</h2>")
        parts.append(html_table(["segment", "questions", "EM", "F1"],
                                [[str(r["segment"]), str(r["questions"]), f"{r['exact']:.2f}", f"{r['f1']:.2f}"]
                                 for r in rows]))
    parts += ["<h2>Plots</h2>"] + [html_figure(p.stem.replace("_", " "), p, p.name) for p in plots]
    return html_page(title, parts)


def plot_position_curve(mentions, scores, max_seq_len: int, path: Path, bin_size: int = 32) -> Path:
    from ..analysis.report import _plt

    plt = _plt()
    edges = np.arange(0, max_seq_len + bin_size, bin_size)
    pos = {q: min(p) for q, p in mentions.items() if p and q in scores}
    f1s, ns, centers = [], [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        q = [k for k, p in pos.items() if lo <= p < hi]
        if q:
            f1s.append(100 * np.mean([scores[k][1] for k in q]))
            ns.append(len(q))
            centers.append((lo + hi) / 2)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(centers, f1s, marker="o")
    for x, y, n in zip(centers, f1s, ns):
        ax.annotate(f"n={n}", (x, y), fontsize=7, ha="center", xytext=(0, 5), textcoords="offset points")
    ax.set_xlabel(f"token position of the earliest gold answer start (bins of {bin_size})")
    ax.set_ylabel("F1")
    ax.set_title("F1 by gold answer position")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_position_updates(updates: dict, path: Path, label: str = "") -> Path:
    from ..analysis.report import plot_update_fractions

    return plot_update_fractions({label: PositionUpdateCounter.fractions(updates)}, path,
                                 f"Position-embedding updates ({updates['steps']} steps)")


def diagnose(model, data, output_dir, xs=(100,), overrides=None, progress: bool = True,
             bias_samples: int = 2000) -> dict:
    """Evaluate `model` on `data` and write position analyses into `output_dir`:
    diagnosis.md / .json, first the position bias (drop and PSI with bootstrap intervals of
    `bias_samples` resamples, `analysis.bias`), then F1 by answer-position quartile (gold and
    predicted, Table 1), S_X^(1) vs S_X^(2) for each X (App. C), EM/F1 by gold answer length (MaP
    Fig. 6) and by answer sentence (Ko et al. 2020), an F1-by-position plot and, for a posbias run,
    the position-embedding update plot (§2.3)."""
    from ..checkpoint import staged_output

    # Everything goes through a temporary folder, renamed when complete (`staged_output`).
    with staged_output(output_dir) as out:
        return _diagnose(model, data, out, Path(output_dir), xs, overrides, progress, bias_samples)


def _diagnose(model, data, out: Path, final: Path, xs, overrides, progress, bias_samples: int = 2000) -> dict:
    """`diagnose`, writing into `out`, which becomes `final` when complete."""
    import time

    from ..analysis.bias import qa_position_bias
    from ..analysis.report import md_table
    from ..checkpoint import eval_config, load_checkpoint, write_run_meta
    from ..utils import atomic_write_json, atomic_write_text
    from . import metrics as M
    from .evaluate import evaluate_checkpoint
    from .readers import read_dataset

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
    mentions = gold_mention_positions(ds.examples, tokenizer, max_seq_len=d.max_seq_len, doc_stride=d.doc_stride,
                                      max_query_len=d.max_query_len, context_first=d.context_first)
    gold_quartiles = quartile_labels({q: min(p) if p else None for q, p in mentions.items()}, d.max_seq_len)
    sentences = answer_sentence_labels(ds.examples)
    tables = {
        "gold_position_quartile": _table(gold_quartiles, scores),
        "pred_position_quartile": _table(quartile_labels(predicted_start_positions(nbest, preds), d.max_seq_len),
                                         scores),
    }
    # S_X (§6.1): a mention in the front X tokens of any window, not only of the first holding it.
    every = gold_mention_positions(ds.examples, tokenizer, max_seq_len=d.max_seq_len, doc_stride=d.doc_stride,
                                   max_query_len=d.max_query_len, context_first=d.context_first, windows="every")
    for x in xs:
        tables[f"first_x_tokens(x={x})"] = _table(first_x_labels(every, int(x)), scores)
    tables["answer_length"] = _table(answer_length_labels(ds.examples), scores)
    tables["answer_sentence"] = _table(sentences, scores)
    bias = qa_position_bias({"gold_position_quartile": gold_quartiles, "answer_sentence": sentences}, scores,
                            samples=bias_samples)
    plots = [plot_position_curve(mentions, scores, d.max_seq_len, out / "f1_by_position.png")]
    run_dir = Path(model).parent
    if (run_dir / "position_updates.json").is_file():
        plots.append(plot_position_updates(json.loads((run_dir / "position_updates.json").read_text(encoding="utf-8")),
                                           out / "position_updates.png"))
    title = f"Position diagnosis of `{model}` on `{ds.path}`"
    intro = [f"{result['total']} questions, {result['windows']} windows (max_seq_len {d.max_seq_len}, doc_stride "
             f"{d.doc_stride}): EM {result.get('exact_match', result.get('exact')):.2f}, "
             f"F1 {result['f1']:.2f}.",
             "Positions are token indices in the input window ([CLS] = 0). Gold: the earliest gold mention "
             "(in the first window holding it). Predicted: the start of the predicted answer (the paper's Table 1). "
             "S_X(1): a gold mention starts in the first X tokens of any window (§6.1)."]
    bias_head, bias_body, bias_note = _bias_block(bias)
    md = [f"# {title}", "", "## Position bias", "", md_table(bias_head, bias_body), "", bias_note, "",
          intro[0], "", intro[1], ""]
    titles = {"gold_position_quartile": "F1 by quarter of the window holding the gold answer start",
              "pred_position_quartile": "F1 by quarter of the window holding the predicted start (Table 1)",
              "answer_length": "EM/F1 by length of the shortest gold answer, in words (MaP Fig. 6)",
              "answer_sentence": "EM/F1 by the paragraph sentence holding the first gold answer (Ko et al. 2020)"}
    for name, rows in tables.items():
        md += _md(rows, titles.get(name, f"{name}: S_X(1) = some gold mention within the first X tokens, "
                                         "S_X(2) = all later (App. C)"))
    md += [f"![{p.stem}]({p.name})" for p in plots]
    atomic_write_text(out / "diagnosis.md", "\n".join(md) + "\n")
    atomic_write_text(out / "diagnosis.html", _html(title, intro, tables, titles, plots, bias))
    summary = {"position_bias": bias, "model": str(model), "data": ds.path, "metrics": result, "tables": tables,
               "plots": [str(final / p.name) for p in plots]}
    atomic_write_json(out / "diagnosis.json", summary)
    write_run_meta(out, cfg, "diagnose qa", model, ds.path, t0, skipped=ds.skipped)
    return summary
