"""An experiment's report (a grid of runs): its store aggregated (`posbias.experiment.aggregation`) and
rendered (`posbias.render`, with the tables and plots of `posbias.analysis.report`) into report.md, report.html,
report.json and plots/.

It sits above both: the rendering knows no experiment, and the experiment runner writes no report
(`posbias.experiment` does not import this module: it loads the tasks, and torch with them).
"""
from __future__ import annotations

import json

from ..analysis.bias import experiment_rows, gap_rows
from ..analysis.report import (GAP_NOTE, NO_BIAS, _mean_sd, _no_std, _scope, bias_note, bias_sentences, bias_table,
                               code_table, comparison_table, gap_table, plot_comparison, plot_curves, plot_segments,
                               plot_updates, segment_table)
from ..outputs import claim_folder, no_link
from ..render import Document, fmt, md_escape
from ..config import DEFAULT_TASK
from ..tasks import get_task
from ..utils import atomic_write_json
from .aggregation import aggregate, aggregate_segments, load_results


def write_report(exp_dir, bootstrap_samples: int = 10_000, *, only: list[str] | None = None,
                 baseline: str | None = None, output_dir=None) -> dict:
    """Aggregate the experiment's store and write report.md, report.html and plots/*.png into
    `output_dir` (default: the experiment folder). `only` (shell patterns of run names) and
    `baseline` (a method) select a sub-comparison, e.g. mask variants against `mean` at one size."""
    results = load_results(exp_dir, only=only, baseline=baseline)
    exp_dir = claim_folder(output_dir or exp_dir, "experiment report: output folder")  # new, empty or ours
    rows = aggregate(results, bootstrap_samples=bootstrap_samples)
    seg_rows = aggregate_segments(results, bootstrap_samples=bootstrap_samples)
    bias_rows = experiment_rows(results)
    # Task-specific analyses (QA: corrections vs boundaries, Random Padding paper §6.2).
    improvements, sections = [], []
    for name in sorted({json.loads(run["config_json"]).get("task", DEFAULT_TASK) for run in results["runs"]}):
        analyse = get_task(name).improvement_rows  # an optional capability: None where the task has none
        improvements += analyse(results) if analyse is not None else []
        more = getattr(get_task(name), "report_sections", None)  # optional too (a plug-in may lack it)
        sections += more(results) if more is not None else []
    plots = no_link(exp_dir / "plots", "experiment report")
    plots.mkdir(exist_ok=True)
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    metrics = sorted(metrics, key=lambda m: m not in ("F1", "accuracy"))  # the main metric first
    metrics = [m for m in metrics if "(" not in m]  # F1(α) rows have their own figure (report_figures)
    figures = [(f"Method comparison ({m})", plot_comparison(rows, results["methods"],
                                                           plots / f"comparison_{m.lower().replace(' ', '_')}.png", m))
               for m in metrics]
    figures.append(("Learning curves", plot_curves(results, plots / "learning_curves.png")))
    figures += [(p.stem.replace("_", " "), p) for p in plot_segments(seg_rows, results["methods"], plots)]
    figures.append(("Position-embedding updates", plot_updates(results, plots / "position_updates.png")))
    for name in sorted({json.loads(run["config_json"]).get("task", DEFAULT_TASK) for run in results["runs"]}):
        draw = get_task(name).report_figures  # an optional capability: None where the task has none
        figures += draw(results, plots) if draw is not None else []
    figures = [(t, p) for t, p in figures if p is not None]

    runs = results["runs"]
    status = {s: sum(r["status"] == s for r in runs) for s in sorted({r["status"] for r in runs})}
    wall = sum(r["wall_seconds"] or 0 for r in runs)

    def summary(esc):  # the runs line (Markdown), names from the spec through `esc`
        return (f"Runs: {len(runs)} ({', '.join(f'{v} {esc(k)}' for k, v in status.items())}); "
                f"methods: {', '.join(esc(m) for m in results['methods'])} "
                f"(baseline **{esc(results['baseline'])}**); "
                f"total wall time {wall / 60:.1f} min."
                + (f" Runs selected with --only {' '.join(esc(x) for x in only)}." if only else ""))

    doc = Document(f"Experiment {results['name']}")
    # The position bias first: one number per bucketing and method, before the detail.
    doc.heading("Position bias")
    gaps = gap_rows(bias_rows, results["baseline"])
    if bias_rows:
        doc.bullets(bias_sentences(bias_rows, md_escape))
        doc.table(*bias_table(bias_rows))
        doc.paragraph(bias_note(bias_rows))
        if gaps:
            doc.heading("Change of the position gap against the baseline", level=3)
            doc.table(*gap_table(gaps))
            doc.paragraph(GAP_NOTE)
    else:
        doc.paragraph(NO_BIAS)
    doc.paragraph(summary(md_escape))
    doc.paragraph("Each cell is the mean ± sample std over seeds. Δ is method − baseline over the seeds both "
                  "have (marked when that is fewer than a mean covers), paired by seed "
                  "(t-test over seeds) and by example (bootstrap over QA questions, scores averaged over seeds, "
                  "or over tagging sentences, the corpus-level main metric recomputed on each resample; "
                  + (f"{bootstrap_samples:,} resamples)" if bootstrap_samples else
                     "no resamples here: `--bootstrap-samples 0`, so the bootstrap columns are empty)")
                  + ". The 95% CI (t, seeds) is the t-interval of Δ over the paired seeds: what "
                  "the seeds support (with 3 seeds it spans ±4.3 standard errors). With several comparisons the "
                  "seed-level p-value is also given Holm-adjusted over the table's comparisons; a Δ is bold only "
                  "when that adjusted p-value and the bootstrap's are below 0.05. "
                  "`val` is each run's `data.eval_file`, the set its best checkpoint was selected on (an "
                  "optimistic estimate); other eval sets are scored once, with that checkpoint.")
    doc.heading("Results")
    doc.table(*comparison_table(rows))
    if seg_rows:
        doc.heading("Segments")
        doc.paragraph("Segments by gold answer position (`first_x_tokens`, `gold_position_quartile`), gold answer "
                      "sentence (`answer_sentence`) or gold answer length (`answer_length`: words of the shortest "
                      "gold answer) hold the same questions for every method: their Δ F1 is tested over seeds and "
                      "by a paired bootstrap over the segment's questions (answer positions need each run's `best/` "
                      "checkpoint for its tokenizer: in a store copied without them that bootstrap is left empty). "
                      "Segments by predicted position differ by method (t-test only).")
        doc.table(*segment_table(seg_rows))
    if improvements:
        doc.heading("How the method improves")
        doc.paragraph("Among questions where the method's F1 beats the baseline's (same seed): a correction when "
                      "the two answers share no token, else a more precise boundary (Random Padding paper §6.2).")
        doc.table(["data", "eval set", "method", "seeds", "questions improved (mean)",
                   "more precise boundaries, % (mean ± std)", "corrections, %"],
                  [[_scope(r), r["eval_set"], r["method"], str(r["seeds"]), f"{r['improved_mean']:.1f}",
                    _mean_sd(r["boundary_share_mean"], r["boundary_share_std"],
                             1 if _no_std(r["boundary_share_std"]) else r["seeds"]),
                    fmt(100 - r["boundary_share_mean"])] for r in improvements])
    for heading, text, head, body, _ in sections:
        doc.heading(heading)
        doc.paragraph(md_escape(text))
        doc.table(head, body)
    ch, cb = code_table(runs)
    if cb:
        doc.heading("Code and versions")
        doc.paragraph("The code each finished run was trained with: the posbias checkout's commit, `+ changes` "
                      "when tracked files differed from it, `not recorded` for runs of a posbias that did not "
                      "record it (or not run from a git checkout).")
        doc.table(ch, cb)
    doc.heading("Plots")
    for title, p in figures:
        doc.figure(title, p, f"plots/{p.name}")
    doc.write(exp_dir, "report")
    atomic_write_json(exp_dir / "report.json", {"position_bias": bias_rows, "position_gap": gaps, "rows": rows,
                                                "segments": seg_rows,
                                                "improvements": improvements,
                                                **({"sections": {h: js for h, _, _, _, js in sections}} if sections else {})})
    return {"report_md": str(exp_dir / "report.md"), "report_html": str(exp_dir / "report.html"),
            "plots": [str(p) for _, p in figures], "rows": len(rows)}
