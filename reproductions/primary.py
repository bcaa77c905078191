"""The claims' primary tests: each row of reproductions/summary.yaml names, before its verdict, the one
comparison its verdict rests on (one metric, one comparison, one direction: the paper's), and, where the
paper gives one, the paper's effect size. This module computes them from the archived stores:

- the mean difference over seeds (paired by seed) with its 95% t-interval;
- the one-sided p value in the paper's direction (H0: no effect or the other sign);
- that p adjusted by Holm's method over the paper's primary tests (its family: one test per claim, not
  every cell of a report's table);
- against the paper's size, the one-sided p of "at least the paper's effect" (H0: the effect is at least
  the paper's; a small p says it is smaller), and `smaller`: that p below 0.05, i.e. the one-sided 95%
  confidence bound of the effect lies on the weak side of the paper's number.

Everything else a row prints is secondary: reported unadjusted, and labelled so.

    primary:                              # a row's tests (a list: a row that bundles claims has several)
      - label: "CP, the authors' sub-token F1(10)"
        store: docs/experiments/tpb_conll_authors
        eval_set: "test D*(k)"
        metric: "sub-token F1(10)"
        method: cp                        # the arm ...
        versus: {method: baseline}        # ... against this (default: the store's baseline; or another
                                          #     metric or data set of the same runs: {metric: F1})
        direction: greater                # the paper's sign of arm − versus: greater | less
        paper_effect: 1.65                # optional: the paper's arm − versus
    primary: {none: "why no seed-level test decides this claim"}

A diagnosis (`docs/diagnoses/<name>`, one deterministic model: no seeds) is tested over its questions,
paired by question, from its scores.json (every question's score at every position):

      - label: "Ms-PoE − unmodified in the middle, answer probability"
        diagnosis: docs/diagnoses/generation_gemma_squad_dev_k5_mspoe
        scores: loglik/mspoe/loglik       # the arm's per-question scores (scores.json key)
        versus: loglik/original/loglik    # minus these, at the same positions
        positions: middle                 # middle (2..k-1) | all | [1-based positions]
        direction: greater
      - label: "U-shape, answer probability"
        diagnosis: docs/diagnoses/generation_gemma_squad_dev_k5
        scores: loglik/original/loglik
        statistic: u_shape                # the middle below both edges: middle − first and middle − last,
        direction: less                   # each one-sided; p is the larger (both must hold), diff the weaker

Optional keys: dataset (the store's data set of the arm; `versus` may name another), only (shell
patterns of run names), segmenter and segment (a QA store's segment of the questions, e.g.
first_x_tokens(x=100) / S100(2): its F1; `metric` then names it); segmenter with `rear` and `front` (two
segments): the run's rear F1 minus its front F1, so that arm − versus is the difference in differences of
the position gap (e.g. Random Padding's control: rear − front, RP − baseline, `direction: greater`).
"""
from __future__ import annotations

import math
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from posbias.analysis.stats import holm, t_interval  # noqa: E402
from posbias.experiment.aggregation import load_results, metric_value  # noqa: E402

ALPHA = 0.05
DIRECTIONS = ("greater", "less")
STATS = ("diff", "ci_low", "ci_high", "p", "p_holm", "p_size", "n", "family", "arm_mean", "versus_mean")


def tests_of(row: dict) -> list[dict]:
    """A row's primary tests (a list; empty for `primary: {none: ...}` or no `primary`)."""
    p = row.get("primary")
    if not p or (isinstance(p, dict) and "none" in p):
        return []
    return list(p) if isinstance(p, list) else [p]


@lru_cache(maxsize=None)
def _results(store: str, only: tuple[str, ...] | None) -> dict:
    return load_results(ROOT / store, only=list(only) if only else None)


def seed_values(test: dict, arm: dict) -> dict[int, float]:
    """{seed: value} of one arm (the test's keys overridden by `arm`) from its store's finished runs.
    With `rear` and `front` (segments of `segmenter`), the value is the run's F1 on the rear segment minus
    its F1 on the front one: the position gap, whose method − baseline difference is the difference in
    differences (`analysis.bias.gap_rows`)."""
    spec = {**test, **arm}
    if spec.get("rear") is not None:
        rear = seed_values({k: v for k, v in spec.items() if k not in ("rear", "front")}, {"segment": spec["rear"]})
        front = seed_values({k: v for k, v in spec.items() if k not in ("rear", "front")}, {"segment": spec["front"]})
        return {s: rear[s] - front[s] for s in sorted(set(rear) & set(front))}
    results = _results(spec["store"], tuple(spec["only"]) if spec.get("only") else None)
    method = spec.get("method") or results["baseline"]
    out = {}
    segments = {}
    if spec.get("segmenter"):  # F1 on one segment of the questions (QA stores' segments table)
        for row in results["segments"]:
            if (row["eval_set"], row["segmenter"], row["segment"]) == (spec["eval_set"], spec["segmenter"], spec["segment"]):
                segments[row["run"]] = row["f1"]
    for r in results["runs"]:
        if r["status"] != "finished" or r["method"] != method or r["dataset"] != spec.get("dataset"):
            continue
        if spec.get("segmenter"):
            if r["name"] in segments:
                out[r["seed"]] = float(segments[r["name"]])
            continue
        metrics = r["metrics"].get(spec["eval_set"])
        value = metric_value(metrics, spec["metric"]) if metrics else None
        if value is not None:
            out[r["seed"]] = float(value)
    if not out:
        raise LookupError(f"no finished run of {spec['store']} {spec.get('dataset') or ''}/{spec['eval_set']}/"
                          f"{spec.get('segment') or spec['metric']}/{method}")
    return out


@lru_cache(maxsize=None)
def _scores(diagnosis: str) -> dict:
    import json

    return json.loads((ROOT / diagnosis / "scores.json").read_text(encoding="utf-8"))


def _positions(spec, k: int) -> list[int]:
    """0-based columns of `positions` (middle | all | 1-based list) in a k-position score matrix."""
    if spec in (None, "all"):
        return list(range(k))
    if spec == "middle":
        return list(range(1, k - 1))
    return [int(p) - 1 for p in spec]


def question_differences(test: dict) -> list[list[float]]:
    """A diagnosis test's per-question differences (one list; two for `u_shape`: middle − first,
    middle − last), from its scores.json."""
    scores = _scores(test["diagnosis"])
    if test["scores"] not in scores:
        raise LookupError(f"{test['diagnosis']}/scores.json has no {test['scores']!r}")
    arm = scores[test["scores"]]
    k = len(arm[0])
    mean = lambda row, cols: sum(row[c] for c in cols) / len(cols)  # noqa: E731
    if test.get("statistic") == "u_shape":
        mid = _positions("middle", k)
        return [[mean(r, mid) - r[0] for r in arm], [mean(r, mid) - r[-1] for r in arm]]
    cols = _positions(test.get("positions"), k)
    versus = scores.get(test.get("versus")) if test.get("versus") else None
    if test.get("versus") and versus is None:
        raise LookupError(f"{test['diagnosis']}/scores.json has no {test['versus']!r}")
    return [[mean(a, cols) - (mean(v, cols) if versus else 0.0) for a, v in zip(arm, versus or arm)]]


def _one_sided(d: list[float], sign: float, effect=None) -> dict:
    """The paired one-sided t-test of the mean of `d` (module docstring's keys but the arm means)."""
    from scipy import stats

    n = len(d)
    out = {"n": n, "diff": sum(d) / n if n else math.nan, "p": math.nan, "p_size": math.nan, "smaller": False,
           **t_interval(d)}
    if n < 2:
        return out
    mean = out["diff"]
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n) if sd else 0.0
    out["p"] = (0.0 if sign * mean > 0 else 1.0) if sd == 0 else float(stats.t.sf(sign * mean / se, n - 1))
    if effect is not None:
        out["p_size"] = ((0.0 if sign * (mean - effect) < 0 else 1.0) if sd == 0
                         else float(stats.t.cdf(sign * (mean - effect) / se, n - 1)))
        out["smaller"] = bool(out["p_size"] < ALPHA)
    return out


def _compute_diagnosis(test: dict) -> dict:
    sign = 1.0 if test["direction"] == "greater" else -1.0
    parts = [_one_sided(d, sign, test.get("paper_effect")) for d in question_differences(test)]
    out = max(parts, key=lambda r: (r["p"] if r["p"] == r["p"] else math.inf))  # the weaker part decides
    out = dict(out)
    out["arm_mean"] = out["versus_mean"] = math.nan
    if len(parts) > 1:
        out["parts"] = parts
    return out


def compute(test: dict) -> dict:
    """One primary test, unadjusted: {n, diff, arm_mean, versus_mean (over the paired seeds), ci_low,
    ci_high (the two-sided 95% t-interval), p
    (one-sided in the paper's direction), p_size (one-sided: smaller than the paper's), smaller (bool)}.
    n < 2: p, interval and p_size NaN."""
    from scipy import stats

    if test.get("direction") not in DIRECTIONS:
        raise ValueError(f"primary test {test.get('label') or test.get('method')!r}: direction must be one of {DIRECTIONS}")
    if test.get("diagnosis"):  # over questions, paired (module docstring)
        return _compute_diagnosis(test)
    arm = seed_values(test, {})
    versus_spec = {"method": None, **(test.get("versus") or {})}
    versus = seed_values(test, versus_spec)
    seeds = sorted(set(arm) & set(versus))
    d = [arm[s] - versus[s] for s in seeds]
    n = len(d)
    sign = 1.0 if test["direction"] == "greater" else -1.0
    out = {"n": n, "diff": sum(d) / n if n else math.nan, "p": math.nan, "p_size": math.nan, "smaller": False,
           "arm_mean": sum(arm[s] for s in seeds) / n if n else math.nan,
           "versus_mean": sum(versus[s] for s in seeds) / n if n else math.nan, **t_interval(d)}
    if n < 2:
        return out
    mean = out["diff"]
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    if sd == 0:
        out["p"] = 0.0 if sign * mean > 0 else 1.0
    else:
        se = sd / math.sqrt(n)
        out["p"] = float(stats.t.sf(sign * mean / se, n - 1))
    effect = test.get("paper_effect")
    if effect is not None:
        if sd == 0:
            out["p_size"] = 0.0 if sign * (mean - effect) < 0 else 1.0
        else:
            out["p_size"] = float(stats.t.cdf(sign * (mean - effect) / se, n - 1))
        out["smaller"] = bool(out["p_size"] < ALPHA)
    return out


def primary_tests(summary: dict) -> list[dict]:
    """Every row's primary tests, computed, with `p_holm` over its paper's family: [{claim, paper,
    index, label, test, family, **compute(test)}] in summary order."""
    out = []
    for row in summary["rows"]:
        for i, test in enumerate(tests_of(row)):
            out.append({"claim": row["claim"], "paper": row.get("paper"), "index": i,
                        "label": test.get("label") or f"{test.get('method')}, {test['metric']}",
                        "test": test, **compute(test)})
    for paper in {t["paper"] for t in out}:
        family = [t for t in out if t["paper"] == paper]
        for t, adjusted in zip(family, holm([t["p"] for t in family])):
            t["p_holm"] = adjusted
            t["family"] = sum(1 for x in family if x["p"] == x["p"])
    return out


def significant(t: dict) -> bool:
    """The primary test holds: in the paper's direction, Holm-adjusted p below ALPHA."""
    return t.get("p_holm", math.nan) < ALPHA


def describe(test: dict) -> str:
    """The comparison in words, run names resolved from the store: "cp − baseline, sub-token F1(10)
    (test D*(k)) > 0"; a comparison of two metrics of the same runs: "baseline: sub-token F1(10) −
    sub-token F1 (test D*(k)) < 0"."""
    if test.get("diagnosis"):
        sign = ">" if test["direction"] == "greater" else "<"
        if test.get("statistic") == "u_shape":
            return f"{test['scores']}: middle − first {sign} 0 and middle − last {sign} 0 (paired by question)"
        where = test.get("positions") or "all"
        where = f"positions {', '.join(map(str, where))}" if isinstance(where, list) else f"{where} positions"
        versus = f" − {test['versus']}" if test.get("versus") else ""
        return f"{test['scores']}{versus}, {where} (paired by question) {sign} 0"
    base = _results(test["store"], tuple(test["only"]) if test.get("only") else None)["baseline"]
    versus = test.get("versus") or {}
    arm = "/".join(str(x) for x in (test.get("dataset"), test.get("method") or base) if x)
    other = "/".join(str(x) for x in (versus.get("dataset", test.get("dataset")),
                                      versus.get("method") or (test.get("method") or base if "metric" in versus
                                                               or "dataset" in versus else base)) if x)
    sign = ">" if test["direction"] == "greater" else "<"
    if test.get("rear") is not None:
        return (f"{arm} − {other}, F1 {test['rear']} − F1 {test['front']} ({test['segmenter']}, {test['eval_set']}) "
                f"{sign} 0")
    if "metric" in versus:
        return f"{arm}: {test['metric']} − {versus['metric']} ({test['eval_set']}) {sign} 0"
    return f"{arm} − {other}, {test['metric']} ({test['eval_set']}) {sign} 0"
