"""The "Which method should I use?" page, generated from the archived experiment stores: per task of
reproductions/which_method.yaml, each method's position-bias effect, its change of the position gap
(tagging: the metric at copy k_max minus the metric at k = 1; QA: rear answers' F1 minus front answers'),
and its change of overall quality, both method − baseline (mean over seeds, paired by seed, with the 95%
t-interval over seeds); the gap changes of a task's methods are Holm-adjusted over those methods. A
verdict word per method and one recommendation line per task follow from a fixed rule (`verdict`,
`recommendation`) that the page states.

    python reproductions/which_method.py [--out FILE] [--tasks reproductions/which_method.yaml]

Prints the Markdown to stdout, or writes it to FILE. The links to the Results pages assume the page
sits beside them (results/which-method.md); `page(results_dir=...)` prefixes them otherwise. A task
whose store folder is absent is an error naming it, unless the task says `optional: true` (skipped).
"""
from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posbias.analysis.stats import holm, paired_ttest  # noqa: E402
from posbias.experiment.aggregation import aggregate, load_results, metric_value  # noqa: E402

sys.path.insert(0, str(ROOT / "reproductions"))
import summary_file  # noqa: E402

TASKS = Path("reproductions") / "which_method.yaml"
EXPERIMENTS = Path("docs") / "experiments"
MINUS = "\u2212"
RECOMMENDED, COSTS, WORSE, NOISE, UNTESTED = (
    "recommended here", "costs quality", "increases position bias", "within seed noise", "not tested over seeds")
GAINS = "gains quality"  # tasks without a position-bias metric
ALPHA = 0.05
WORDS = {  # in the order the rule checks them
    UNTESTED: "fewer than 2 seeds shared with the baseline: no interval",
    WORSE: "the gap change is significant on the widening side (Holm-adjusted p < 0.05 over the task's "
           "methods)",
    RECOMMENDED: "the gap change is significant on the narrowing side (Holm-adjusted p < 0.05 over the task's "
                 "methods) and the quality interval does not lie entirely below 0",
    COSTS: "the quality interval lies entirely below 0",
    GAINS: "(a task without a position-bias metric) the quality interval lies entirely above 0",
    NOISE: "none of the above: the seeds do not separate the method from the baseline",
}
KEEP = "keep the baseline, or test on your own data with `posbias experiment run`."


def num(x: float, sign: bool = False) -> str:
    """`x` with 2 decimals and a U+2212 minus (a + too when `sign`); a rounded zero is 0.00."""
    s = f"{x:.2f}"
    if float(s) == 0:
        return "0.00"
    return s.replace("-", MINUS) if s.startswith("-") else "+" + s if sign else s


def tested(c: dict | None) -> bool:
    """Whether the comparison `c` has an interval over seeds (2 seeds or more)."""
    return c is not None and c["n"] >= 2 and not math.isnan(c["ci_low"])


def cell(c: dict | None) -> str:
    """A comparison {n, diff, ci_low, ci_high} as "+1.57 [−0.47, 3.62]"; "—" for none."""
    if c is None:
        return "—"
    if not tested(c):
        return f"{num(c['diff'], True)} ({c['n']} seed{'s' * (c['n'] != 1)}, no interval)"
    return f"{num(c['diff'], True)} [{num(c['ci_low'])}, {num(c['ci_high'])}]"


def side(c: dict, better: str = "higher") -> int:
    """+1 when the interval of `c` lies entirely on the improving side of 0, −1 entirely on the other."""
    lo, hi = (c["ci_low"], c["ci_high"]) if better == "higher" else (-c["ci_high"], -c["ci_low"])
    return 1 if lo > 0 else -1 if hi < 0 else 0


def significant_side(c: dict, better: str = "higher") -> int:
    """+1 when `c` (a gap change with `p_holm`) is significant on the improving side, −1 on the other, else 0.
    Without `p_holm` (one method) its interval decides, which is the same test."""
    if "p_holm" not in c:
        return side(c, better)
    if not c["p_holm"] < ALPHA:
        return 0
    up = c["diff"] > 0 if better == "higher" else c["diff"] < 0
    return 1 if up else -1


def verdict(bias: dict | None, quality: dict, better: str = "higher") -> str:
    """The rule, in `WORDS`' order: `not tested over seeds` with fewer than 2 seeds; `increases position
    bias` when the gap change is significant on the widening side (checked before quality: a method that
    widens the gap is not excused by its quality); `recommended here` when it is significant on the narrowing
    side and the quality interval is not entirely below 0; `costs quality` when the quality interval lies
    entirely below 0; else `within seed noise`. Without a bias metric (`bias` None): `costs quality`,
    `gains quality` or `within seed noise`. Pure."""
    if not tested(quality) or (bias is not None and not tested(bias)):
        return UNTESTED
    q = side(quality)
    if bias is None:
        return COSTS if q < 0 else GAINS if q > 0 else NOISE
    b = significant_side(bias, better)
    return WORSE if b < 0 else RECOMMENDED if b > 0 and q >= 0 else COSTS if q < 0 else NOISE


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _deltas(rows: list[dict]) -> str:
    return _names([f"{r['label']} (Δ {cell(r['bias'])})" for r in rows])


def _who(some: list[dict], named: list[dict]) -> str:
    if len(some) < len(named):
        return _names([r["label"] for r in some])
    return {1: "it", 2: "both"}.get(len(named), "all of them")


def recommendation(rows: list[dict], regime: str, *, has_bias: bool = True, better: str = "higher",
                   also: str | None = None) -> str:
    """The task's one line from its rows ({label, bias, quality, verdict, also}), never stronger than
    the verdicts: a method is named as reducing position bias only when `recommended here`. Pure."""
    if not has_bias:
        return ("No position-bias metric: these methods have no positional premise, so none is recommended "
                "for position bias; the table gives their effect on quality only.")
    good = [r for r in rows if r["verdict"] == RECOMMENDED]
    if not good:
        if all(r["verdict"] == UNTESTED for r in rows):
            return "In this regime no method was tested over seeds (fewer than 2): " + KEEP
        costly = [r for r in rows if r["verdict"] == COSTS and significant_side(r["bias"], better) > 0]
        if costly:
            return (f"In this regime {_deltas(costly)} reduced position bias only at a cost in quality, and"
                    " no method did so without one: " + KEEP)
        return "In this regime no method reduced position bias beyond seed noise: " + KEEP
    line = f"In this regime, {_deltas(good)} reduced position bias without a measurable quality loss"
    # A quality gain too: part of the gain may be general, unless the `also` metric fell (then it is not).
    down = [r for r in good if also and tested(r.get("also")) and side(r["also"]) < 0]
    up = [r for r in good if side(r["quality"]) > 0 and r not in down]
    if up:
        line += f"; {_who(up, good)} raised quality too, so part of the gain may be general rather than positional"
    if down:
        line += f"; {_who(down, good)} lost {also} (last column)"
    n = " or ".join(str(s) for s in sorted({r["bias"]["n"] for r in good}))
    return f"{line}; {n} seeds; regime: {' '.join(regime.split()).rstrip('.')}."


def _compare(results: dict, agg: list[dict], spec: dict, method: str, dataset: str | None, where: str) -> dict:
    """The {n, diff, ci_low, ci_high, p} of `method` − baseline on one metric or (pooled) segment; with
    `minus` (a metric) or `minus_segment`, on the gap: the value minus that one, per run (the
    difference in differences of the position gap)."""
    if "minus" in spec or "minus_segment" in spec:
        return paired_ttest(_gap(results, spec, method, dataset, where),
                            _gap(results, spec, results["baseline"], dataset, where))
    if "segment" in spec:
        return _segment_ttest(results, spec, method, dataset, where)
    rows = [r for r in agg if r["eval_set"] == spec["eval_set"] and r["metric"] == spec["metric"]
            and r["method"] == method and r["dataset"] == dataset]
    if len(rows) != 1 or "ttest" not in rows[0]:
        raise LookupError(f"{where}: no comparison of {method} on {spec['eval_set']} / {spec['metric']}"
                          f" (dataset {dataset}) in the store")
    return rows[0]["ttest"]


def _gap(results: dict, spec: dict, method: str, dataset: str | None, where: str) -> dict[int, float]:
    """{seed: the gap} of `method`'s runs: `metric` − `minus` (of the eval set), or F1 on `segment` − F1 on
    `minus_segment` (each pooled over its segments)."""
    if "minus_segment" in spec:
        rear = _segment_f1(results, {**spec}, method, dataset, where)
        front = _segment_f1(results, {**spec, "segment": spec["minus_segment"]}, method, dataset, where)
        return {s: rear[s] - front[s] for s in sorted(set(rear) & set(front))}
    out = {}
    for r in results["runs"]:
        if r["status"] != "finished" or r["method"] != method or r["dataset"] != dataset:
            continue
        m = r["metrics"].get(spec["eval_set"]) or {}
        a, b = metric_value(m, spec["metric"]), metric_value(m, spec["minus"])
        if a is not None and b is not None:
            out[r["seed"]] = float(a) - float(b)
    if not out:
        raise LookupError(f"{where}: no {spec['metric']} and {spec['minus']} on {spec['eval_set']} for {method}"
                          f" (dataset {dataset}) in the store")
    return out


def _segment_f1(results: dict, spec: dict, method: str, dataset: str | None, where: str) -> dict[int, float]:
    """{seed: F1} of `method` on the questions of `spec`'s segment(s), pooled weighted by their questions."""
    segs = spec["segment"] if isinstance(spec["segment"], list) else [spec["segment"]]
    runs = {r["name"]: r for r in results["runs"] if r["status"] == "finished" and r["dataset"] == dataset
            and r["method"] == method}
    acc: dict = {}
    for s in results["segments"]:
        r = runs.get(s["run"])
        if r and s["eval_set"] == spec["eval_set"] and s["segmenter"] == spec["segmenter"] and s["segment"] in segs:
            a = acc.setdefault(r["seed"], [0.0, 0])
            a[0], a[1] = a[0] + s["n"] * s["f1"], a[1] + s["n"]
    out = {seed: total / n for seed, (total, n) in acc.items() if n}
    if not out:
        raise LookupError(f"{where}: no {spec['segmenter']} segment {', '.join(segs)} on {spec['eval_set']}"
                          f" for {method} (dataset {dataset}) in the store")
    return out


def _segment_ttest(results: dict, spec: dict, method: str, dataset: str | None, where: str) -> dict:
    """F1 on the questions of `spec`'s segment(s) per run, pooled over segments weighted by their
    questions (one segment: its F1, as `aggregate_segments`), paired t-test over seeds."""
    return paired_ttest(_segment_f1(results, spec, method, dataset, where),
                        _segment_f1(results, spec, results["baseline"], dataset, where))


def task_rows(task: dict, store: Path) -> list[dict]:
    """Per method of `task`: {method, label, bias, quality, verdict}, recomputed from `store`."""
    where = f"which_method.yaml: task {task['task']!r} (store {task['store']})"
    results = load_results(store, baseline=task.get("baseline"))
    agg = aggregate(results, bootstrap_samples=0)  # the t-tests over seeds only
    dataset, rows = task.get("dataset"), []
    for method, label in task["methods"].items():
        bias = _compare(results, agg, task["bias"], method, dataset, where) if task.get("bias") else None
        quality = _compare(results, agg, task["quality"], method, dataset, where)
        also = _compare(results, agg, task["also"], method, dataset, where) if task.get("also") else None
        rows.append({"method": method, "label": label, "bias": bias, "quality": quality, "also": also})
    biased = [r["bias"] for r in rows if r["bias"] is not None and tested(r["bias"])]
    for c, adjusted in zip(biased, holm([c["p"] for c in biased])):  # over the task's methods
        c["p_holm"] = adjusted
    for r in rows:
        r["verdict"] = verdict(r["bias"], r["quality"], (task.get("bias") or {}).get("better", "higher"))
    return rows


def _p(p: float) -> str:
    """A p-value for the table: "<0.001", 3 decimals, or "—" where there is none."""
    if p != p:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _md(text: str) -> str:
    """Yaml text as one Markdown line: whitespace folded, * and | escaped (D* is no emphasis)."""
    return " ".join(str(text).split()).replace("*", "\\*").replace("|", "\\|")


def task_section(task: dict, rows: list[dict], results_dir: str = "") -> str:
    bias, quality, also = task.get("bias"), task["quality"], task.get("also")
    link = f" (full report: [Results]({results_dir}{task['results']}.md))" if task.get("results") else ""
    metrics = (f"Position gap: {_md(bias['label'])}; its change, method − baseline, is the method's effect on "
               f"position bias ({bias.get('better', 'higher')} is better). " if bias else "")
    out = [f"## {_md(task['task'])}", "", _wrap(f"**Regime:** {_md(task['regime'])}. Store: `{task['store']}`{link}."), "",
           _wrap(metrics + f"Quality: {_md(quality['label'])}."
                 + (f" Last column: {_md(also['label'])} (shown, not part of the verdict)." if also else "")), ""]
    out += [_wrap(_md(task["note"])), ""] if task.get("note") else []
    holm_head = "gap p (Holm over the methods)" if len(rows) > 1 else "gap p"
    out += ["| method | gap change Δ [95% CI, unadjusted] | " + (f"{holm_head} | " if bias else "")
            + "quality Δ [95% CI] | seeds | verdict |" + (f" {_md(also['head'])} |" if also else ""),
            "|---|---|" + ("---|" if bias else "") + "---|---|---|" + ("---|" if also else "")]
    for r in rows:
        seeds = " / ".join(str(n) for n in sorted({c["n"] for c in (r["bias"], r["quality"]) if c}))
        p = _p(r["bias"].get("p_holm", r["bias"]["p"])) if r["bias"] else ""
        out.append(f"| {_md(r['label'])} | {cell(r['bias'])} | " + (f"{p} | " if bias else "")
                   + f"{cell(r['quality'])} | {seeds} | {r['verdict']} |" + (f" {cell(r['also'])} |" if also else ""))
    line = recommendation([{**r, "label": _md(r["label"])} for r in rows], _md(task["regime"]), has_bias=bool(bias),
                          better=(bias or {}).get("better", "higher"), also=also and _md(also["label"]))
    return "\n".join(out + ["", _wrap(f"**Recommendation:** {line}"), ""])


def _wrap(text: str) -> str:
    """A prose paragraph as Markdown lines of at most ~100 characters."""
    return "\n".join(textwrap.wrap(" ".join(text.split()), width=100, break_long_words=False, break_on_hyphens=False))


INTRO = """# Which method should I use?

For each task below, the table compares each position-bias method with the baseline trained the same
way. A method's effect on position bias is its change of the position gap: the gap is how much worse the
positions the bias hurts score than the positions it spares (a tagger's metric on the last copy of a
repeated sentence minus its metric on the sentence alone; a reader's F1 on rear answers minus its F1 on
front ones), and the change is the method's gap minus the baseline's, per seed (a difference in
differences). A method that lifts every position alike leaves the gap where it was: its gain is general,
not positional. Beside it, the method's change of overall quality. Both are method − baseline in points,
mean over seeds, paired by seed, with the 95% t-interval over seeds (unadjusted); the gap changes of a
task's methods are also tested with Holm's correction over those methods, and the verdict reads that
adjusted p. With 3 to 5 seeds an interval is wide: a small true effect can sit inside it.

The verdict of a method is the first of these that applies:

{words}

The recommendation line under each table follows from the verdicts: a method is named as reducing
position bias without a quality loss only when it is `recommended here`; otherwise the line says that
no method did so (beyond seed noise, or without a cost in quality) and to keep the baseline.

These results speak only for the regimes listed: MiniLM-L6 at small budgets (hundreds of steps, a few
thousand examples, CPU), a few seeds. A method that does not help here may help a larger model or a
longer run, and one that helps here may not help on your data: test it there with
`posbias experiment run`.
"""


def page(root: Path = ROOT, spec: dict | None = None, *, results_dir: str = "") -> str:
    """The page's Markdown. `spec`: the tasks (default: `root`/reproductions/which_method.yaml);
    stores are read from `root`/docs/experiments/. `results_dir`: prefix of the Results-page links."""
    root = Path(root)
    if spec is None:
        spec = summary_file.load_tasks(root / TASKS)
    words = "\n".join(f"- `{w}`: {d}." for w, d in WORDS.items())
    out = [INTRO.format(words=words)]
    for task in spec["tasks"]:
        store = root / EXPERIMENTS / task["store"]
        if not (store / "experiment.sqlite").is_file():
            if task.get("optional"):
                continue
            raise FileNotFoundError(f"which_method.yaml: task {task['task']!r}: store {EXPERIMENTS / task['store']}"
                                    " not found (add it, or mark the task `optional: true`)")
        out.append(task_section(task, task_rows(task, store), results_dir))
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="file to write the page to (default: stdout)")
    ap.add_argument("--tasks", help="the tasks file (default: reproductions/which_method.yaml)")
    args = ap.parse_args(argv)
    try:
        spec = summary_file.load_tasks(args.tasks) if args.tasks else None
    except summary_file.InputError as e:
        print(f"which_method: {e}", file=sys.stderr)
        return 2
    try:
        text = page(ROOT, spec)
    except (OSError, LookupError, ValueError) as e:
        print(f"which_method: {e}", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
