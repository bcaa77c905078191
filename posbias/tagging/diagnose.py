"""`posbias diagnose tagging`: the position-bias diagnosis of any local token-classification model
(a posbias run or a Hugging Face `*ForTokenClassification` folder) on a tagging file: the
duplicated-test-set evaluation F1(α) / Prec(α) / Rec(α) in duplicate and shift mode, per class,
consistency, and the data's length and class-position statistics (`posbias.tagging.duplicated`,
`posbias.tagging.stats`). Writes diagnosis.md, a self-contained diagnosis.html, diagnosis.json
and its plots, with the run's config and versions.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..analysis.verdict import (MIN_BUCKET, QUALITY_FLOOR, VERDICT_HEAD, alpha_axis, curve_intervals, evidence, note,
                                psi, quality, quality_text, report_line, sentence, table_row, terminal_block)
from ..errors import ConfigError
from ..evaluation import opened_for_eval, write_run_meta
from ..outputs import staged_output
from ..render import Document, data_label, md_escape, plot_text, pyplot, short_name
from ..utils import atomic_write_json
from .config import POSITION_BATCH_TOKENS
from .duplicated import (COPY_LAYOUT, COPY_SCORES, MODES, length_subset, position_eval, save_copy_scores,
                         sentence_counts)
from .evaluate import align_labels
from .features import learns_word_labels
from .inputs import length_pool, read_for
from .stats import class_positions, plot_class_positions, plot_length_density

_NAMES = {"f1": "F1", "precision": "Prec", "recall": "Rec", "accuracy": "Acc", "macro_f1": "macro F1",
          "consistency": "consistency", "f1_seqeval_subtoken": "sub-token F1"}


def _keys(result: dict) -> list[str]:
    """The metrics a result's tables and curves show: NER F1, precision, recall; POS accuracy, macro
    F1; then the authors' sub-token F1 (results from before it existed lack it) and consistency."""
    dup = result.get("duplicate") or result.get("shift") or {}
    sub = ["f1_seqeval_subtoken"] if any("f1_seqeval_subtoken" in c for c in dup.get("cells", [])[:1]) else []
    if result["scheme"] != "none":
        return ["f1", "precision", "recall"] + sub + ["consistency"]
    return ["accuracy", "macro_f1"] + sub + ["consistency"]


def _fmt(mean, std=None) -> str:
    """'mean ± std', or the mean alone where there is no std (one k, or one cell in shift mode)."""
    if mean is None:
        return "–"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None and std == std else "")  # std == std: not NaN


def _interval(result: dict, mode: str, key: str) -> list | None:
    """Per α the 95% bootstrap interval over sentences of metric `key` in `mode`, where the verdict
    computed one (ratio metrics: F1, precision, recall, accuracy); else None."""
    axis = ((result.get("position_bias") or {}).get("axes") or {}).get(mode) or {}
    if key == result["metric"]:
        return axis.get("curve_ci")
    return (axis.get("curves_ci") or {}).get(key)


def _alpha_curve(ax, by_alpha: list[dict], key: str, ci: list | None, style: dict, label: str,
                 std_band: bool = False) -> None:
    """One mode's M(α) on `ax`: with its 95% interval per α as error bars where there is one, else
    (duplicate mode) ± sample std over k >= α as a band, said in the label."""
    rows = [r for r in by_alpha if r.get(f"{key}_mean") is not None]
    a = np.array([r["alpha"] for r in rows])
    m = np.array([r[f"{key}_mean"] for r in rows], dtype=float)
    if ci and len(ci) == len(by_alpha):
        lo = np.array([ci[r["alpha"] - 1][0] for r in rows])
        hi = np.array([ci[r["alpha"] - 1][1] for r in rows])
        # clipped at 0: a constant metric's interval can miss its mean by a rounding (99.99999999999999)
        ax.errorbar(a, m, yerr=[np.maximum(m - lo, 0), np.maximum(hi - m, 0)], label=f"{label} (95% CI)", **style)
        return
    style = {k: v for k, v in style.items() if k != "capsize"}
    if std_band:
        s = np.array([np.nan if r[f"{key}_std"] is None else r[f"{key}_std"] for r in rows], dtype=float)
        ax.plot(a, m, label=f"{label} (band: ± std over k)", **style)
        ax.fill_between(a, m - s, m + s, color=style.get("color"), alpha=0.2)
    else:
        ax.plot(a, m, label=label, **style)


def plot_position_curves(result: dict, path: Path, title: str) -> Path:
    """The paper's Fig. 7 for one model: the main metric, precision and recall (POS: accuracy, macro
    F1), the authors' sub-token F1 and consistency against α. Duplicate mode: the mean over k >= α
    with its 95% bootstrap interval over sentences as error bars (ratio metrics; the others show
    ± sample std over k >= α as a band, said in the legend), each k as a thin line; shift mode
    dashed, with its interval where there is one. The main metric's panel says the verdict's
    front − rear effect."""
    plt = pyplot()
    keys = _keys(result)
    cols = min(2, len(keys))  # at most two panels per row: legible in a page 1,100 px wide
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:  # an odd panel count leaves one cell empty
        ax.set_visible(False)
    dup, shift = result.get("duplicate"), result.get("shift")
    for ax, key in zip(axes.flat, keys):
        if dup:
            for k in sorted({c["k"] for c in dup["cells"]}):
                cells = sorted((c for c in dup["cells"] if c["k"] == k), key=lambda c: c["alpha"])
                if len(cells) > 1:
                    ax.plot([c["alpha"] for c in cells], [c.get(key) for c in cells], color="tab:blue", lw=0.5,
                            alpha=0.25)
            _alpha_curve(ax, dup["by_alpha"], key, _interval(result, "duplicate", key),
                         dict(marker="o", ms=4, capsize=3, color="tab:blue"), "duplicate, mean over k ≥ α",
                         std_band=True)
        if shift and "by_alpha" in shift:
            _alpha_curve(ax, shift["by_alpha"], key, _interval(result, "shift", key),
                         dict(marker="s", ms=3, ls="--", capsize=2, color="tab:orange"),
                         "shift (one copy, positions moved)")
        ax.set_xlabel("α (copy; later = further right in the input)")
        ax.set_title(f"{_NAMES[key]}(α)", fontsize=10)
        axis = ((result.get("position_bias") or {}).get("axes") or {}).get("duplicate")
        if key == result["metric"] and axis and axis.get("effect") is not None:
            e = axis["effect"]
            ax.annotate(f"copy 1 − copy {axis['alphas'][-1]} (paired): {e:+.1f}" + (
                f" [{axis['ci'][0]:+.1f}, {axis['ci'][1]:+.1f}]" if axis.get("ci") else ""),
                (0.02, 0.02), xycoords="axes fraction", fontsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(plot_text(title), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_per_class(result: dict, path: Path, title: str) -> Path | None:
    """Per-class F1(α) (duplicate mode, mean over k >= α), the classes the paper's Fig. 9 shows."""
    dup = result.get("duplicate")
    if not dup:
        return None
    plt = pyplot()
    classes = list(dup["by_alpha"][0]["per_class"])
    if result["scheme"] == "none":  # POS: the most frequent tags only, or the plot is unreadable
        first = next(c for c in dup["cells"] if c["k"] == 1)
        classes = sorted(classes, key=lambda t: -first["per_class"].get(t, {}).get("support", 0))[:8]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for cls in classes:
        rows = [r for r in dup["by_alpha"] if r["per_class"][cls]["f1_mean"] is not None]
        ax.plot([r["alpha"] for r in rows], [r["per_class"][cls]["f1_mean"] for r in rows], marker="o",
                label=plot_text(cls))
    ax.set_xlabel("α (copy)")
    ax.set_ylabel("F1 (mean over k ≥ α)")
    ax.set_title(plot_text(title))
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _alpha_table(result: dict) -> tuple[list[str], list[list[str]]]:
    keys = _keys(result)
    dup, shift = result.get("duplicate"), result.get("shift")
    head = ["α", "k values"] + [f"{_NAMES[k]}(α)" for k in keys]
    if shift and "by_alpha" in shift:
        head += [f"shift {_NAMES[keys[0]]}(α)", "shift consistency"]
    body = []
    for i in range(result["subset"]["k_max"]):
        row = [str(i + 1)]
        if dup:
            r = dup["by_alpha"][i]
            row += [f"{r['alpha']}..{result['subset']['k_max']}"] + [_fmt(r[f"{k}_mean"], r[f"{k}_std"]) for k in keys]
        else:
            row += ["–"] * (1 + len(keys))
        if shift and "by_alpha" in shift:
            r = shift["by_alpha"][i]
            row += [_fmt(r[f"{keys[0]}_mean"]), _fmt(r["consistency_mean"])]
        body.append(row)
    return head, body


def _class_table(result: dict, alphas=(1, 5, 10)) -> tuple[list[str], list[list[str]]] | None:
    dup = result.get("duplicate")
    if not dup:
        return None
    k_max = result["subset"]["k_max"]
    alphas = [a for a in alphas if a <= k_max]
    first = next(c for c in dup["cells"] if c["k"] == 1)
    classes = sorted(dup["by_alpha"][0]["per_class"], key=lambda t: -first["per_class"].get(t, {}).get("support", 0))
    head = ["class", "support"] + [f"F1({a})" for a in alphas] + [f"Δ F1({alphas[-1]}) − F1(1)"]
    body = []
    for cls in classes:
        vals = [dup["by_alpha"][a - 1]["per_class"][cls] for a in alphas]
        d = (vals[-1]["f1_mean"] - vals[0]["f1_mean"]) if None not in (vals[-1]["f1_mean"], vals[0]["f1_mean"]) else None
        body.append([cls, str(first["per_class"].get(cls, {}).get("support", 0))]
                    + [_fmt(v["f1_mean"], v["f1_std"]) for v in vals] + [_fmt(d)])
    return head, body


MODE_AXES = {"duplicate": "copy α, duplicate mode", "shift": "copy α, shift mode"}


def position_verdict(result: dict, counts: dict, *, min_size: int = MIN_BUCKET, samples: int = 2000,
                     floor: float = QUALITY_FLOOR) -> dict:
    """The verdict block's content (`analysis.verdict.alpha_axis`) per mode: the main metric M(α)
    (mean over k >= α, the paper's tables) with bootstrap intervals over sentences, the signed
    effect M(1) − M(k_max), the trend per copy, PSI over α; the quality check of M on D*_test as is.

    Args:
        counts: mode -> ((k, α) per cell, (cells, n, 2) per-sentence counts), `duplicated.sentence_counts`.
    """
    key = result["metric"]
    axes = {}
    for mode in MODES:
        part = result.get(mode) or {}
        if "by_alpha" not in part:
            continue
        if mode in counts:
            cells, arrays = counts[mode]
            axes[mode] = alpha_axis(cells, arrays[key], min_size=min_size, samples=samples)
            if axes[mode] is not None:  # the other ratio metrics' intervals, for the plot
                axes[mode]["curves_ci"] = {k: curve_intervals(cells, v, samples=samples) for k, v in arrays.items()
                                           if k != key}
        else:  # a result without counts (from before they were kept): the curve alone, no interval
            curve = [r[f"{key}_mean"] for r in part["by_alpha"]]
            axes[mode] = _curve_only(curve, result["subset"]["evaluated_sentences"], min_size)
    first = next(iter(axes.values()), None)
    metric = _NAMES[key]
    score = result.get("summary", {}).get(key)
    return {"evidence": first["evidence"] if first else "too few",
            "sentence": sentence(first, metric=metric, where=_where(next(iter(axes), ""))) if first else "",
            "axes": axes, "metric": key, "quality": quality(score, floor, metric), "min_size": min_size,
            "samples": samples}


def _where(mode: str) -> str:
    return f"{mode} mode" if mode else ""


def _curve_only(curve: list, n: int, min_size: int) -> dict | None:
    """An `alpha_axis`-shaped dict from an α curve alone (no per-sentence counts: no interval)."""
    vals = [v for v in curve if v is not None]
    if len(vals) < 2 or curve[0] is None or curve[-1] is None:
        return None
    alphas = list(range(1, len(curve) + 1))
    slope = float(np.polyfit(alphas, [np.nan if v is None else v for v in curve], 1)[0]) if None not in curve else None
    return {"alphas": alphas, "curve": curve, "curve_ci": None, "sentences": n, "min_size": min_size, "samples": 0,
            "front": {"label": "copy 1", "n": n, "score": curve[0]},
            "rear": {"label": f"copy {len(curve)}", "n": n, "score": curve[-1]},
            "effect": float(curve[0] - curve[-1]), "ci": None,
            "trend": None if slope is None else {"slope": slope, "per": 1.0, "unit": "copy", "ci": None, "p": None},
            "psi": psi(vals), "psi_ci": None, "evidence": evidence(curve[0] - curve[-1], None, n >= min_size)}


def _axes(bias: dict) -> list[tuple[str, dict | None, dict]]:
    metric = _NAMES[bias["metric"]]
    return [(MODE_AXES[m], v, {"metric": metric, "where": _where(m)}) for m, v in bias["axes"].items()]


def _bias_block(result: dict, bias: dict) -> tuple[str, list[str], list[list[str]], list[str]]:
    """The verdict: (headline sentence, table head, table body, notes); the quality warning is
    `quality_text(bias["quality"])`, shown apart (`Document.warning`)."""
    name = _NAMES[result["metric"]]
    body = [table_row(MODE_AXES[m], v, name) for m, v in bias["axes"].items()]
    if "skipped" in (result.get("shift") or {}):
        body.append([MODE_AXES["shift"], "–", "–", "–", "–", "–", "skipped"])
    notes = []
    n = result["subset"].get("evaluated_sentences", 0)
    notes.append(f"Front: copy 1, rear: copy {result['subset']['k_max']} of the duplicated test sets, {name}(α) "
                 f"averaged over k ≥ α as in the paper's tables; the same {n:,} sentences at every α. "
                 + note(bias["min_size"], bias["samples"], " (sentences resampled, the same draw at every copy: "
                        "paired); the trend is the slope of the α curve per copy", permutation=False, buckets=False))
    head = [("trend [95% CI]" if h.startswith("trend") else h) for h in VERDICT_HEAD]
    return bias["sentence"], head, body, notes


def verdict_lines(result: dict, output_dir) -> list[str]:
    """The terminal's view of a tagging diagnosis: the verdict and where the report is."""
    bias = result["position_bias"]
    key = result["metric"]
    title = (f"Position bias of {short_name(result['model'])} on {short_name(result.get('data_name', result['data']))}: "
             f"{result['subset']['evaluated_sentences']:,} sentences, {_NAMES[key]} "
             f"{_fmt(result['summary'].get(key))} (k = 1)")
    lines = terminal_block(title, _axes(bias), bias["quality"], report_line(output_dir, len(result.get("plots", []))),
                           _NAMES[key])
    if "skipped" in (result.get("shift") or {}):
        lines.insert(-1, f"  shift mode skipped: {result['shift']['skipped']}")
    return lines


def write_report(result: dict, out: Path, title: str, data_plots: list[tuple[str, Path]] = (), *,
                 min_size: int = MIN_BUCKET, samples: int = 2000, floor: float = QUALITY_FLOOR) -> list[Path]:
    """diagnosis.md / .html / .json and the plots of a `position_eval` result, into `out`; the
    verdict (`position_verdict`) first, also stored in `result["position_bias"]`. The result's
    per-sentence counts are used for the intervals and taken out of it (they are not JSON)."""
    out.mkdir(parents=True, exist_ok=True)
    counts = sentence_counts(result)
    layout = result.pop(COPY_LAYOUT, None)
    if counts:  # every cell's per-sentence counts, for analyses by sentence (an experiment's store keeps them)
        save_copy_scores(out / COPY_SCORES, counts, layout)
    result["position_bias"] = bias = position_verdict(result, counts, min_size=min_size, samples=samples, floor=floor)
    name = f"{short_name(result.get('model', ''))} on {short_name(result.get('data_name', result['data']))}"
    plots = [("F1(α), Prec(α), Rec(α) and consistency (Fig. 7)",
              plot_position_curves(result, out / "position_curves.png", name))]
    pc = plot_per_class(result, out / "per_class.png", "Per-class F1(α), duplicate mode")
    if pc is not None:
        plots.append(("Per-class F1(α) (Fig. 9)", pc))
    plots += list(data_plots)
    metric = _NAMES[result["metric"]]
    intro = _intro(result, md_escape)
    head, body = _alpha_table(result)
    headline, bh, bb, bnotes = _bias_block(result, bias)
    doc = Document(title)
    doc.heading("Position bias")
    doc.paragraph(f"**{headline}**")
    warning = quality_text(bias["quality"])
    if warning:  # above the tables it qualifies
        doc.warning(warning)
    doc.table(bh, bb)
    for x in bnotes + intro:
        doc.paragraph(x)
    doc.heading(f"{metric}(α)")
    doc.table(head, body)
    ct = _class_table(result)
    if ct:
        doc.heading("Per class (duplicate mode)")
        doc.table(*ct)
    doc.heading("Plots")
    doc.figures(plots)
    doc.write(out, "diagnosis")
    atomic_write_json(out / "diagnosis.json", {"position_bias": bias, **result})  # the bias first
    return [Path(p) for _, p in plots]


def _intro(result: dict, esc) -> list[str]:
    """The report's paragraphs on the data, D* and the metrics (Markdown); the file names, the
    separator token and the reason a mode was skipped, users' text, pass through `esc`."""
    sub = result["subset"]
    metric = _NAMES[result["metric"]]
    intro = [
        f"Data: {esc(data_label(result['data']))} ({sub['split_sentences']:,} sentences). "
        + (f"D*: sentence lengths in [{sub['length_bounds'][0]:g}, {sub['length_bounds'][1]:g}] words, the "
           f"{sub['quantiles'][0]:g} and {sub['quantiles'][1]:g} quantiles of "
           + (f"the lengths of {sub['pool_sentences']:,} sentences pooled from "
              f"{'; '.join(esc(data_label(p)) for p in sub['pool'])}"
              if sub.get("pool") else "this file's lengths")
           + f": {sub['subset_sentences']:,} sentences. "
           if sub.get("length_bounds") else "All sentences (no length subset). ")
        + f"Evaluated for every k = 1..{sub['k_max']}: the {sub['evaluated_sentences']:,} whose {sub['k_max']} copies "
          f"fit {sub['max_len']} tokens ({sub['left_out']:,} left out, {100 * sub['left_out_share']:.1f}%); "
          f"copies joined by the token {esc(sub['separator'])}.",
        f"{metric} on D*_test as is (k = 1): **{_fmt(result['summary'].get(result['metric']))}**. "
        f"{metric}(α) is copy α's score, averaged (± sample std) over every k ≥ α as in the paper's tables; "
        "consistency(α) is the share of what copy 1 got right that copy α also gets right. "
        "Shift mode feeds one copy whose position ids start where copy α would (no repeated context).",
    ]
    if "f1_seqeval_subtoken" in _keys(result):
        ner = result["scheme"] != "none"
        labels = (f"each word's label in the model's scheme ({result.get('subtoken_scheme', result['scheme']).upper()})"
                  if ner else "each word's tag")
        intro.append(f"Sub-token F1 is the paper's {'NER' if ner else 'POS'} \"F1\" as the authors' code computes "
                     f"it: seqeval's default (lenient) mode, micro F1, over sub-token label sequences ({labels} on "
                     "all its sub-tokens), from "
                     + ("each sub-token's own prediction (the model learned its word's label there)."
                        if result.get("subtoken_predictions") == "own" else
                        "each word's prediction (the model was not trained on its word's label at every sub-token).")
                     + (f" {metric} is strict seqeval over words, in the data's scheme." if ner else ""))
    if "skipped" in (result.get("shift") or {}):
        intro.append(f"Shift mode skipped: {esc(result['shift']['skipped'])}.")
    t = result["timing"]
    intro.append(f"{t['real_tokens']:,} real tokens in {t['seconds']:.1f} s ({t['tokens_per_s']:,.0f} tokens/s).")
    return intro


def model_quantiles(model) -> tuple[float, float]:
    """D*'s quantiles for diagnosing `model`: the ones it trained on (its `data.length_quantiles`: the
    authors' presets use 0.15-0.75), else Q1-Q3 (a model trained on every sentence, a Hugging Face
    folder)."""
    from ..checkpoint import is_posbias_checkpoint, read_posbias_files

    if is_posbias_checkpoint(model):
        q = getattr(read_posbias_files(model)[0].data, "length_quantiles", None)
        if q:
            return float(q[0]), float(q[1])
    return 0.25, 0.75


def diagnose(model, data, output_dir, *, k_max: int = 10, quantiles="model", modes=MODES,
             max_len: int | None = None, batch_tokens: int = POSITION_BATCH_TOKENS, overrides=None, progress: bool = True,
             bias_samples: int = 2000, min_bucket: int = MIN_BUCKET, quality_floor: float = QUALITY_FLOOR) -> dict:
    """Position-bias diagnosis of a tagging checkpoint on `data` (see the module docstring).
    Returns the `position_eval` result with the verdict (`position_bias`, `verdict_lines`: what
    the terminal shows; `bias_samples` bootstrap resamples over sentences, fewer than `min_bucket`
    evaluated sentences: too few to tell, a warning under `quality_floor` points) and the paths written."""
    t0 = time.time()
    if isinstance(quantiles, str):
        if quantiles != "model":
            raise ConfigError(f"quantiles must be a (low, high) pair, None (every sentence) or 'model', got {quantiles!r}")
        quantiles = model_quantiles(model)
    # Everything goes through a temporary folder, renamed when complete (`staged_output`).
    with staged_output(output_dir) as out, opened_for_eval(model, overrides, "tagging") as (net, tokenizer, cfg):
        ds = read_for(data, cfg)
        if cfg.data.max_eval_examples:
            ds.examples = ds.examples[: cfg.data.max_eval_examples]
        ds = align_labels(ds, net.labels, net.scheme, cfg.data.label_map, label_source=net.label_source)
        # D*'s bounds: quantiles of the lengths `data.length_pool` names (the model's config:
        # train + dev pooled by default, the authors' rule), or of this file's own.
        pool = length_pool(cfg) if quantiles else None
        result = position_eval(net, tokenizer, ds, k_max=k_max, quantiles=tuple(quantiles) if quantiles else None,
                               modes=tuple(modes), max_len=max_len, batch_tokens=batch_tokens, progress=progress,
                               length_pool=pool, own_subtokens=learns_word_labels(cfg.data.label_subtokens, net.scheme),
                               keep_counts=True, model_name=str(model))
        result["model"] = str(model)
        result["data_name"] = data_label(data if isinstance(data, (str, Path, list, tuple)) else ds.path)
        lengths = np.array([len(e.words) for e in ds.examples])
        bounds = result["subset"].get("length_bounds")
        data_plots = [("Sentence-length density (D* shaded)",
                       plot_length_density({Path(ds.path).name: lengths}, out / "length_density.png",
                                           {Path(ds.path).name: bounds} if bounds else None))]
        subset, _ = length_subset(ds.examples, tuple(quantiles) if quantiles else None, pool=pool)
        positions = class_positions(type(ds)(ds.path, ds.format, ds.scheme, subset))
        if positions:
            data_plots.append(("Class positions in D*",
                               plot_class_positions(positions, out / "class_positions.png", "Class positions in D*")))
        plots = write_report(result, out, f"Position diagnosis of {model} on {result['data_name']}", data_plots,
                             min_size=min_bucket, samples=bias_samples, floor=quality_floor)
        write_run_meta(out, cfg, "diagnose tagging", model, ds.path, t0, skipped=ds.skipped)
    result["plots"] = [str(Path(output_dir) / p.name) for p in plots]
    result["verdict_lines"] = verdict_lines(result, output_dir)
    return result


def plot_methods_by_alpha(results: dict, plots_dir) -> list[tuple[str, Path]]:
    """Experiment report figures: for each position evaluation (metrics named "<set> D*(k)"), the
    main metric against α per method, mean ± sample std over seeds, duplicate (solid) and shift
    (dashed) mode."""
    finished = [r for r in results["runs"] if r["status"] == "finished"]
    sets = sorted({k for r in finished for k, m in r["metrics"].items() if "report" in m})
    out = []
    for eval_set in sets:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        metric = None
        for i, method in enumerate(results["methods"]):
            ms = [r["metrics"][eval_set] for r in finished if r["method"] == method and eval_set in r["metrics"]]
            if not ms:
                continue
            metric = ms[0]["metric"]
            color = f"C{i}"
            for tag, ls in (("", "-"), ("shift_", "--")):
                curves = [m[f"{tag}{metric}_by_alpha"] for m in ms if f"{tag}{metric}_by_alpha" in m]
                if not curves:
                    continue
                arr = np.array([[np.nan if v is None else v for v in c] for c in curves], dtype=float)
                mean = np.nanmean(arr, axis=0)
                a = np.arange(1, len(mean) + 1)
                ax.plot(a, mean, ls=ls, marker="o" if not tag else None, color=color,
                        label=plot_text(f"{method}{' (shift)' if tag else ''} (n={len(curves)})"))
                if len(curves) > 1 and not tag:
                    std = np.nanstd(arr, axis=0, ddof=1)
                    ax.fill_between(a, mean - std, mean + std, color=color, alpha=0.15)
        ax.set_xlabel("α (copy)")
        ax.set_ylabel(plot_text(f"{_NAMES.get(metric, metric)}(α), mean over k ≥ α"))
        ax.set_title(plot_text(f"{eval_set}: {_NAMES.get(metric, metric)}(α) by method (band: ± std over seeds)"))
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = Path(plots_dir) / f"position_eval_{eval_set.split()[0]}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append((f"{eval_set}: {_NAMES.get(metric, metric)}(α) by method", path))
    return out
