"""F1(α) split by whether copy α sits on position ids a run trained: for an experiment's report.

A method that trains rear position rows (RPP, CP) can raise a later copy's F1 in two ways: the copy sits on
rows it trained, or the model became robust to rows it never trained. The store keeps every (k, α) cell's
per-sentence counts (`duplicated.save_copy_scores`) and each run's position-embedding updates (`curves`,
kind `position_updates`: the fraction of optimizer steps in which each position id got a gradient), so for
each run and copy α of D*_test(k_max) the sentences split into those whose copy α lies wholly on ids that
run updated (at least once) and the others, and the method's entity F1 on each part is compared with the
baseline's on the same sentences (same seed), then averaged over seeds.
"""
from __future__ import annotations

import numpy as np

from ..analysis.stats import mean_std, t_interval
from .duplicated import copy_position_span, load_copy_scores


def trained_mask(curves: list[dict], run: str) -> np.ndarray | None:
    """(ids,) bool: the position ids `run` updated in at least one step; None without a record."""
    points = {int(c["step"]): float(c["value"]) for c in curves if c["run"] == run and c["kind"] == "position_updates"}
    if not points:
        return None
    out = np.zeros(max(points) + 1, dtype=bool)
    for i, v in points.items():
        out[i] = v > 0
    return out


def on_trained(span: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(n,) bool: each sentence's copy (its (first, last) position ids) lies wholly on trained ids."""
    ok = np.zeros(len(span), dtype=bool)
    cum = np.r_[0, np.cumsum(~mask)]  # untrained ids before each id
    for i, (a, b) in enumerate(span):
        ok[i] = 0 <= a and b < len(mask) and cum[b + 1] - cum[a] == 0
    return ok


def _num(x) -> float | None:
    """A finite number, or None (JSON has no NaN)."""
    return float(x) if x is not None and x == x else None


def _f1(counts: np.ndarray, keep: np.ndarray) -> float | None:
    num, den = counts[keep].sum(0)
    return 100.0 * num / den if den else None


def copy_rows(results: dict) -> list[dict]:
    """Per eval set, method (not the baseline) and α of D*_test(k_max): the share of sentences whose copy α
    the method's runs trained, and method − baseline entity F1 (POS: accuracy) on those and on the others,
    mean over seeds with its t-interval (module docstring). Empty without per-copy scores."""
    if not results.get("copies"):
        return []
    runs = {r["name"]: r for r in results["runs"] if r["status"] == "finished"}
    loaded = {(c["run"], c["eval_set"]): load_copy_scores(c["data"], f"run {c['run']} ({c['eval_set']})")
              for c in results["copies"] if c["run"] in runs}
    base = results["baseline"]
    out = []
    for eval_set in sorted({es for _, es in loaded}):
        by_seed = {}
        for (name, es), data in loaded.items():
            if es == eval_set:
                r = runs[name]
                by_seed.setdefault((r["dataset"], r["method"]), {})[r["seed"]] = (name, data)
        for (dataset, method), seeds in sorted(by_seed.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            if method == base or (dataset, base) not in by_seed:
                continue
            baseline = by_seed[dataset, base]
            common = sorted(set(seeds) & set(baseline))
            if not common:
                continue
            first = seeds[common[0]][1]
            part = first["modes"].get("duplicate")
            if part is None:
                continue
            metric = "accuracy" if "accuracy" in part else "f1"
            cells = [(int(k), int(a)) for k, a in part["cells"]]
            k_max = max(k for k, _ in cells)
            for alpha in range(1, k_max + 1):
                cell = cells.index((k_max, alpha))
                share, diffs = [], {"trained": [], "untrained": []}
                for s in common:
                    (name, data), (_, bdata) = seeds[s], baseline[s]
                    mask = trained_mask(results["curves"], name)
                    if mask is None:
                        continue
                    span = copy_position_span(alpha, data["body_tokens"], data["prefix"], data["position_base"])
                    keep = on_trained(span, mask)
                    share.append(100.0 * keep.mean())
                    m, b = data["modes"]["duplicate"][metric][cell], bdata["modes"]["duplicate"][metric][cell]
                    for part_name, sel in (("trained", keep), ("untrained", ~keep)):
                        fm, fb = _f1(m, sel), _f1(b, sel)
                        if fm is not None and fb is not None:
                            diffs[part_name].append(fm - fb)
                if not share:
                    continue
                row = {"eval_set": eval_set, "dataset": dataset, "method": method, "alpha": alpha, "k": k_max,
                       "metric": metric, "seeds": len(share), "trained_share": float(np.mean(share))}
                for part_name, d in diffs.items():
                    mean, std = mean_std(d)
                    ci = t_interval(d)
                    row[part_name] = {"delta": _num(mean), "std": _num(std), "n": len(d),
                                      "ci": [_num(ci["ci_low"]), _num(ci["ci_high"])]}
                out.append(row)
    return out


def copy_section(results: dict):
    """The experiment report's section (`posbias.tasks.Task.report_sections`): (heading, text, table head,
    table rows, JSON rows), or None without per-copy scores."""
    rows = copy_rows(results)
    if not rows:
        return None

    def cell(part: dict) -> str:
        if part["delta"] is None:
            return "–"
        ci = part["ci"]
        text = f"{part['delta']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci[0] is not None else "")
        return text.replace("-", "−")

    head = ["eval set", "method", "copy α of k", "seeds", "sentences on trained ids, %",
            "Δ on trained ids [95% CI]", "Δ on untrained ids [95% CI]"]
    body = [[r["eval_set"] if r["dataset"] is None else f"{r['dataset']}/{r['eval_set']}", r["method"],
             f"{r['alpha']} of {r['k']}", str(r["seeds"]), f"{r['trained_share']:.1f}", cell(r["trained"]),
             cell(r["untrained"])] for r in rows]
    text = ("Each run's copy α of D*_test(k) (duplicate mode) is on trained ids when every position id it occupies "
            "got a gradient in at least one of that run's optimizer steps (its position-update record); the "
            "sentences split accordingly, per run. Δ: the method's corpus entity F1 (POS: accuracy) minus the "
            "baseline's (same seed) on the same sentences, mean over seeds with its t-interval. A gain on "
            "untrained ids is robustness to rows the method never trained, not training of them.")
    return "F1(α) on trained and untrained position ids", text, head, body, rows
