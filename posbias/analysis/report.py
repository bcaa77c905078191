"""The experiment report's tables and plots (method comparison, segments, position bias, learning curves,
position-embedding updates, code versions), drawn with the shared rendering of `posbias.render`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..render import fmt, plot_text, pyplot
from .updates import PositionUpdateCounter
from .verdict import EVIDENCE_WORDS

SIGNIFICANCE = 0.05


def _mean_sd(mean, std, n_runs: int) -> str:
    """'mean ± std', or the mean alone (and `(1 run)`) where one run gives no spread."""
    return f"{fmt(mean)} ± {fmt(std)}" if n_runs > 1 else f"{fmt(mean)} (1 run)"


def _no_std(std) -> bool:
    """A std that is not there: one value has none (`mean_std` gives NaN; JSON results None)."""
    return std is None or (isinstance(std, float) and math.isnan(std))


def _bar(std) -> float:
    """An error bar's half-height: none (0) where there is no std."""
    return 0.0 if _no_std(std) else float(std)


def _p(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def significant(row: dict) -> bool:
    """Both tests agree at p < 0.05: the t-test over seeds, Holm-adjusted over the table's comparisons
    where the row has that (`aggregation.adjust_family`), and, when available, the bootstrap over
    examples; only then is a difference bold. The seed-level test decides: a bootstrap over questions
    alone says nothing about another seed."""
    test = row.get("ttest", {})
    t = test.get("p_holm", test.get("p"))
    b = row.get("bootstrap", {}).get("p")
    if t is None or math.isnan(t) or t >= SIGNIFICANCE:
        return False
    return b is None or (not math.isnan(b) and b < SIGNIFICANCE)


def _scope(row) -> str:
    parts = [row.get("dataset"), f"n={row['train_size']}" if row.get("train_size") else None]
    return " ".join(str(p) for p in parts if p) or "–"


def _boot(row) -> str:
    b = row.get("bootstrap")
    return f"{_p(b['p'])} [{fmt(b['ci_low'])}, {fmt(b['ci_high'])}]" if b else ""


def _seed_ci(row) -> str:
    """The t-interval over seeds of a Δ, "–" where fewer than two seeds pair."""
    t = row.get("ttest")
    if not t or t.get("ci_low") is None or t["ci_low"] != t["ci_low"]:
        return "–" if t else ""
    return f"[{fmt(t['ci_low'])}, {fmt(t['ci_high'])}]"


def _t_p(row) -> str:
    """The seed-level p-value, and its Holm adjustment over the table when there is more than one test."""
    t = row.get("ttest")
    if not t:
        return ""
    if t.get("family", 1) > 1 and "p_holm" in t:
        return f"{_p(t['p'])} (Holm {_p(t['p_holm'])})"
    return _p(t["p"])


def _pairs_note(row) -> str:
    """' (3 paired seeds)' when the Δ covers fewer seeds than a mean beside it (the method and the
    baseline were run on different seeds), else ''."""
    pairs = row["ttest"].get("n")
    if pairs is None or pairs == max(row["n_runs"], row.get("baseline_n_runs", row["n_runs"])):
        return ""
    return f" ({pairs} paired seeds)"


def comparison_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["data", "eval set", "metric", "method", "mean ± std", "Δ vs baseline", "95% CI (t, seeds)",
            "t-test p (seeds)", "bootstrap p [95% CI] (examples)", "runs", "wall min"]
    body = []
    for r in rows:
        delta = ""
        if "ttest" in r:
            d = fmt(r["ttest"]["diff"])
            d = ("+" if r["ttest"]["diff"] > 0 else "") + d
            delta = (f"**{d}**" if significant(r) else d) + _pairs_note(r)
        body.append([_scope(r), r["eval_set"], r["metric"], r["method"], _mean_sd(r["mean"], r["std"], r["n_runs"]),
                     delta, _seed_ci(r), _t_p(r), _boot(r), str(r["n_runs"]),
                     f"{r['wall_seconds'] / 60:.1f}"])
    return head, body


def segment_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["data", "eval set", "segmenter", "segment", "questions", "method", "F1 mean ± std", "EM mean ± std",
            "Δ F1", "95% CI (t, seeds)", "t-test p (seeds)", "bootstrap p [95% CI] (questions)"]
    body = []
    for r in rows:
        delta = ""
        if "ttest" in r:
            d = ("+" if r["ttest"]["diff"] > 0 else "") + fmt(r["ttest"]["diff"])
            delta = (f"**{d}**" if significant(r) else d) + _pairs_note(r)
        body.append([_scope(r), r["eval_set"], r["segmenter"], r["segment"], str(r["n_questions"]), r["method"],
                     _mean_sd(r["f1_mean"], r["f1_std"], r["n_runs"]), _mean_sd(r["em_mean"], r["em_std"], r["n_runs"]),
                     delta, _seed_ci(r), _t_p(r), _boot(r)])
    return head, body


def bias_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The "Position bias" block: per bucketing x method, the signed front − rear effect (mean ± std
    over seeds, t-interval over seeds), PSI, and the verdict word (`analysis.bias.experiment_rows`)."""
    def cell(mean, std, n, digits):
        return fmt(mean, digits) + (f" ± {fmt(std, digits)}" if n > 1 else "")

    def side(label, n):
        return "–" if label is None else f"{label}" + (f" (n={n:,})" if n else "")

    head = ["data", "eval set", "bucketing", "method", "front", "rear", "front − rear (mean ± std)",
            "95% CI (t, seeds)", "PSI", "runs", "evidence"]
    body = []
    for r in rows:
        ci = r.get("effect_ci")
        word = r["evidence"] + (f" (score {r['score_mean']:.1f} < {r['floor']:g})" if r.get("below_floor") else "")
        if r["evidence"] == "too few" and r["n_runs"] < 2:
            word += f" ({r['n_runs']} run{'s' if r['n_runs'] != 1 else ''} with sized groups)"
        body.append([_scope(r), r["eval_set"], r["bucketing"], r["method"], side(r["front"], r.get("front_n")),
                     side(r["rear"], r.get("rear_n")), cell(r["effect_mean"], r["effect_std"], r["n_runs"], 2),
                     f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "–",
                     cell(r["psi_mean"], r["psi_std"], r["n_runs"], 3), str(r["n_runs"]), word])
    return head, body


GAP_WORDS = {"reversed": "yes: smaller", "yes": "no: larger", "no": "not shown", "too few": "too few"}
"""The gap change's interval (`bias.gap_rows`) in words: below 0, the method narrows the position gap."""


def gap_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The "Change of the position gap" block: per bucketing x method, the method − baseline change of the
    front score, of the rear score and of front − rear (difference in differences), each with its 95%
    t-interval over paired seeds (`analysis.bias.gap_rows`)."""
    def cell(part):
        ci = part["ci"]
        return fmt(part["mean"], 2) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")

    head = ["data", "eval set", "bucketing", "method", "front", "rear", "seeds", "Δ front [95% CI]",
            "Δ rear [95% CI]", "Δ (front − rear) [95% CI]", "gap narrowed"]
    body = [[_scope(r), r["eval_set"], r["bucketing"], r["method"], str(r["front"]), str(r["rear"]), str(r["seeds"]),
             cell(r["front_change"]), cell(r["rear_change"]), cell(r["gap_change"]), GAP_WORDS[r["reduces_bias"]]]
            for r in rows]
    return head, body


GAP_NOTE = ("A method's position-bias effect is its change of the gap, not its level: per seed, the method's "
            "front − rear minus the baseline's (a difference in differences; negative: the method narrows the gap), "
            "with the change of each side beside it (Δ front, Δ rear: method − baseline), so that a gap closed by "
            "lowering the front is told from one closed by raising the rear. Means over the seeds both have with "
            "the same front and rear groups, 95% t-intervals over those seeds. \"gap narrowed\": yes when the "
            "interval of Δ (front − rear) lies below 0, no when above, not shown when it covers 0.")


def bias_note(rows: list[dict]) -> str:
    """What the block's numbers are, for the kinds of bucketing it shows (QA buckets, tagging α curves)."""
    kinds = {r["kind"] for r in rows}
    min_size = next((r["min_size"] for r in rows), 30)
    fronts = [text for kind, text in (
        ("buckets", f"the F1 of the first position group minus that of the last, buckets merged in position order "
                    f"until each group holds at least {min_size} questions (smaller ones never set the number)"),
        ("alpha", "metric(1) − metric(k_max) of the duplicated test sets' α curve"))
        if kind in kinds]
    note = (f"Per run: front − rear = {' (QA), or '.join(fronts)}; positive: later positions score lower. Then "
            "mean ± sample std over seeds and a 95% Student-t interval over seeds. Evidence of position bias: \"yes\" "
            "when that interval lies above 0, \"reversed\" below 0, \"no\" when it covers 0, \"too few\" with fewer "
            "than two runs (or groups). PSI = 1 − worst/best over the sized groups (0: flat, 1: a group at 0). "
            "A method whose overall score is under the quality floor is marked: its bias numbers mean little.")
    if "buckets" in kinds:
        note += (" QA buckets: gold answer position (`gold_position_quartile`) and answer sentence "
                 "(`answer_sentence`, Ko et al. 2020; from metrics.json where the spec has no such segments), "
                 "\"no answer\" left out.")
    return note


def bias_sentences(rows: list[dict], esc=str) -> list[str]:
    """The verdict in words, per method, for the first bucketing of each (data, eval set): answer
    position for QA, duplicate mode for tagging. E.g. "base (3 runs), gold_position_quartile on
    val: the rear group (Q4, n=120) scores 4.1 F1 lower than the front one (Q1, n=130) [95% CI over
    seeds 1.2 to 7.0]; evidence of position bias: yes.". `esc` formats the names and labels taken from
    the experiment (`md_escape` for Markdown)."""
    first: dict = {}
    for r in rows:
        first.setdefault((_scope(r), r["eval_set"]), r["bucketing"])
    out = []
    for r in rows:
        if first[(_scope(r), r["eval_set"])] != r["bucketing"]:
            continue
        where = (f"{esc(r['method'])} ({r['n_runs']} run{'s' if r['n_runs'] != 1 else ''}), {esc(r['bucketing'])} "
                 f"on {esc(r['eval_set'])}")
        if r["front"] is None or r["effect_mean"] != r["effect_mean"]:
            out.append(f"{where}: fewer than two position groups of {r['min_size']}; evidence of position bias: "
                       "too few examples to tell.")
            continue
        e, ci = r["effect_mean"], r.get("effect_ci")
        span = (f"95% CI over seeds {fmt(-ci[1] if e < 0 else ci[0], 1)} to {fmt(-ci[0] if e < 0 else ci[1], 1)}"
                if ci else "no interval with one run")
        floor = (f" (its score {r['score_mean']:.1f} is under the quality floor {r['floor']:g}: the numbers mean "
                 "little)" if r.get("below_floor") else "")
        out.append(f"{where}: the rear group ({esc(r['rear'])}) scores {abs(e):.1f} points "
                   f"{'lower' if e >= 0 else 'higher'} than the front one ({esc(r['front'])}) [{span}]; evidence of "
                   "position bias: "
                   f"{EVIDENCE_WORDS[r['evidence']] if r['n_runs'] >= 2 else 'too few runs to tell'}{floor}.")
    return out


NO_BIAS = "No position segments in this experiment."


# ------------------------------------------------------------------------------------------- plots
def plot_comparison(rows: list[dict], methods: list[str], path: Path, metric: str = "F1") -> Path | None:
    """Grouped bars: one group per (data, eval set), one bar per method, error bars = std over seeds."""
    rows = [r for r in rows if r["metric"] == metric]
    if not rows:
        return None
    plt = pyplot()
    groups = list(dict.fromkeys((_scope(r), r["eval_set"]) for r in rows))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) * max(1, len(methods)) / 2 + 2), 4))
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(groups))
    for i, m in enumerate(methods):
        vals = {(_scope(r), r["eval_set"]): r for r in rows if r["method"] == m}
        means = [vals[g]["mean"] if g in vals else np.nan for g in groups]
        stds = [_bar(vals[g]["std"]) if g in vals else 0 for g in groups]
        bars = ax.bar(x + (i - (len(methods) - 1) / 2) * width, means, width, yerr=stds, capsize=4,
                      label=plot_text(m))
        for b, v, sd in zip(bars, means, stds):
            if not np.isnan(v):  # the value, above its error bar
                ax.annotate(f"{v:.1f}", (b.get_x() + b.get_width() / 2, v + (sd or 0)), ha="center", va="bottom",
                            fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(x, [plot_text(f"{s}\n{e}" if s != "–" else e) for s, e in groups])
    ax.set_ylabel(plot_text(f"{metric} (mean ± std over seeds)"))
    ax.set_title(plot_text(f"{metric} by method"))
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def moving_average(x: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average; at the ends it averages the points that exist (no zero padding,
    which would drag the first and last points towards 0)."""
    kernel = np.ones(width)
    return np.convolve(x, kernel, mode="same") / np.convolve(np.ones(len(x)), kernel, mode="same")


def plot_curves(results: dict, path: Path) -> Path | None:
    """Training loss and validation F1 against the step, mean over seeds per method (band = ±1 std)."""
    runs = {r["name"]: r for r in results["runs"]}
    series: dict = {}
    for c in results["curves"]:
        r = runs.get(c["run"])
        if r is None:
            continue
        series.setdefault((c["kind"], r["method"]), {}).setdefault(c["step"], []).append(c["value"])
    if not series:
        return None
    plt = pyplot()
    kinds = ["loss"] + sorted({k for k, _ in series if k.startswith("val_")})
    kinds = [k for k in kinds if any(k == kk for kk, _ in series)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for m in results["methods"]:
            pts = series.get((kind, m))
            if not pts:
                continue
            steps = sorted(pts)
            mean = np.array([np.mean(pts[s]) for s in steps])
            # Sample std over seeds, as in the tables (0 for a single seed).
            std = np.array([np.std(pts[s], ddof=1) if len(pts[s]) > 1 else 0.0 for s in steps])
            if kind == "loss" and len(steps) > 20:  # smooth the noisy per-step loss for readability
                mean = moving_average(mean, max(1, len(steps) // 20))
            ax.plot(steps, mean, marker="o" if kind != "loss" else None, label=plot_text(m))
            ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
        ax.set_xlabel("optimizer step")
        metric = kind.removeprefix("val_").replace("f1", "F1")
        ax.set_ylabel("training loss" if kind == "loss" else plot_text(f"validation {metric}"))
        ax.set_title("Training loss" if kind == "loss" else plot_text(f"Validation {metric} at each evaluation"))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_segments(seg_rows: list[dict], methods: list[str], out_dir: Path) -> list[Path]:
    """One figure per (data, eval set, segmenter): F1 per segment, a bar per method, ± std."""
    plt = pyplot()
    paths = []
    keys = list(dict.fromkeys((_scope(r), r["eval_set"], r["segmenter"]) for r in seg_rows))
    for scope, eval_set, segmenter in keys:
        rows = [r for r in seg_rows if (_scope(r), r["eval_set"], r["segmenter"]) == (scope, eval_set, segmenter)]
        segs = list(dict.fromkeys(r["segment"] for r in rows))
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(segs) + 2), 3.8))
        width = 0.8 / max(len(methods), 1)
        x = np.arange(len(segs))
        for i, m in enumerate(methods):
            vals = {r["segment"]: r for r in rows if r["method"] == m}
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, [vals[s]["f1_mean"] if s in vals else np.nan for s in segs],
                   width, yerr=[_bar(vals[s]["f1_std"]) if s in vals else 0 for s in segs], capsize=3,
                   label=plot_text(m))
        n = {r["segment"]: r["n_questions"] for r in rows}
        ax.set_xticks(x, [plot_text(f"{s}\n(n={n[s]})") for s in segs])
        ax.set_ylabel("F1 (mean ± std over seeds)")
        ax.set_title(plot_text(f"{segmenter} — {eval_set}" + (f" ({scope})" if scope != "–" else "")))
        ax.legend()
        fig.tight_layout()
        parts = ["segments", scope if scope != "–" else "", eval_set, segmenter.strip("_")]
        name = "_".join("".join(ch if ch.isalnum() else "-" for ch in p) for p in parts if p)
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def plot_update_fractions(curves: dict[str, np.ndarray], path: Path, title: str) -> Path:
    """§2.3: one line per label, the % of training steps in which each position id got a gradient."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    last = 0
    for label, frac in curves.items():
        ax.plot(np.arange(len(frac)), 100 * frac, label=plot_text(label))
        used = np.flatnonzero(frac > 0)
        last = max(last, int(used[-1]) + 1 if len(used) else 0)
    # Start left of 0 so that the [CLS] point (position 0, updated every step) is not hidden by the axis.
    ax.set_xlim(-0.02 * (last + 8), max(last + 8, 16))
    ax.set_ylim(-2, 102)
    ax.set_xlabel("position id ([CLS] = 0)")
    ax.set_ylabel("% of training steps with a gradient")
    ax.set_title(plot_text(title))
    if len(curves) > 1 or next(iter(curves), ""):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_updates(results: dict, path: Path) -> Path | None:
    """Position-embedding updates of an experiment, mean over each method's runs: from the store's
    `position_updates` curves (an archive has them), else from a run folder's position_updates.json."""
    import json

    stored: dict = {}
    for c in results["curves"]:
        if c["kind"] == "position_updates":
            stored.setdefault(c["run"], {})[c["step"]] = c["value"]
    by_method: dict = {}
    for r in results["runs"]:
        if r["status"] != "finished":
            continue
        if r["name"] in stored:
            points = stored[r["name"]]
            frac = np.zeros(max(points) + 1)
            frac[list(points)] = list(points.values())
        else:
            f = Path(r["output_dir"]) / "position_updates.json"
            if not f.is_file():
                continue
            frac = PositionUpdateCounter.fractions(json.loads(f.read_text(encoding="utf-8")))
        by_method.setdefault(r["method"], []).append(frac)
    if not by_method:
        return None
    curves = {m: np.mean(by_method[m], axis=0) for m in results["methods"] if m in by_method}
    return plot_update_fractions(curves, path, "Position-embedding updates (mean over seeds)")


def code_table(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """One row per distinct (commit, library versions) among the finished runs, with their count and
    first and last run name: which code produced which records."""
    groups: dict = {}
    for r in runs:
        if r["status"] != "finished":
            continue
        v = json.loads(r.get("versions_json") or "{}")
        commit = v.get("git_commit")
        code = "not recorded" if not commit else commit[:12] + (" + changes" if v.get("git_dirty") else "")
        libs = ", ".join(f"{k} {v[k]}" for k in ("posbias", "torch", "transformers") if k in v)
        groups.setdefault((code, libs), []).append(r["name"])
    body = [[code, libs, str(len(names)), names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}"]
            for (code, libs), names in groups.items()]
    return ["code", "versions", "runs", "runs (first … last)"], body
