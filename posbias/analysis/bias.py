"""Position-bias numbers per bucketing: the drop, the position sensitivity index, and the per-run,
per-method signed front − rear effect of experiment reports. Pure functions. The verdict a
diagnosis opens with (sized buckets, signed effect, trend, evidence) is `posbias.analysis.verdict`.

Given a score per position bucket (QA: F1 by gold-position quartile or by answer sentence, Ko et al.
2020; tagging: F1(α) of the duplicated test sets, Ben Amor et al.):

* drop = best bucket − worst bucket, in points (QA); for the α curve the paper's F1(1) − F1(k_max),
  signed (copy 1 minus the last copy);
* PSI = 1 − min / max over the buckets (position sensitivity index; Zeng et al. 2025 use it for
  position bias in retrieval): 0 when every bucket scores the same, 1 when one scores 0; defined
  as 0 when every bucket scores 0 (no score, hence no position to be sensitive to).

QA intervals: percentile bootstrap, questions resampled with replacement *within* each bucket (the
bucket sizes stay fixed, as the segmentation is given), both statistics recomputed per resample.
max − min of noisy bucket means is biased upward, so when buckets barely differ the interval may
lie above the point value; it is a spread, not a test that the bias is non-zero.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .stats import mean_std
from .verdict import MIN_BUCKET, QUALITY_FLOOR, bucket_rank, evidence, group_label, psi, sized_groups

__all__ = ["NO_ANSWER", "QA_BUCKETINGS", "alpha_bias", "bucket_values", "drop", "experiment_rows", "position_bias",
           "psi", "qa_position_bias", "sized_effect", "t_interval"]

NO_ANSWER = "no answer"
QA_BUCKETINGS = ("gold_position_quartile", "answer_sentence")
"""Segmenters whose buckets are answer positions fixed by the gold answers (the same questions for
every method). `pred_position_quartile` is left out: its buckets differ by model."""
DEFAULT_SAMPLES = 2000
LEVEL = 0.95


def drop(means: Sequence[float]) -> float:
    """Best minus worst bucket score."""
    x = np.asarray(means, dtype=np.float64)
    return float(x.max() - x.min())


def bucket_values(labels: Mapping[str, str], scores: Mapping[str, Sequence[float]], *, index: int = 1,
                  scale: float = 100.0) -> dict[str, np.ndarray]:
    """Bucket -> (n_b,) per-question scores (`scores[qid][index]` x `scale`: F1 in points by default),
    in label order; "no answer" and questions without a label or score are left out."""
    groups: dict[str, list[float]] = {}
    for qid, label in labels.items():
        if label != NO_ANSWER and qid in scores:
            groups.setdefault(str(label), []).append(scale * float(scores[qid][index]))
    return {k: np.asarray(v, dtype=np.float64) for k, v in sorted(groups.items())}


def position_bias(buckets: Mapping[str, Sequence[float]], *, samples: int = DEFAULT_SAMPLES, seed: int = 0,
                  level: float = LEVEL) -> dict | None:
    """Drop and PSI of the bucket means, with bootstrap intervals over questions.

    Args:
        buckets: bucket -> per-question scores (e.g. F1 in points); empty buckets are ignored.
        samples: bootstrap resamples; 0 gives the point values only (intervals None).
        seed: NumPy generator seed (the same seed, the same interval).
        level: coverage of the percentile interval.
    Returns:
        {"buckets", "questions", "best", "worst", "means", "drop", "drop_ci", "psi", "psi_ci",
        "samples", "seed"}, or None with fewer than two non-empty buckets (no position to compare).
    """
    data = {k: np.asarray(v, dtype=np.float64) for k, v in buckets.items() if len(v)}
    if len(data) < 2:
        return None
    names = list(data)
    means = np.array([data[k].mean() for k in names])
    out = {"buckets": len(names), "questions": int(sum(len(v) for v in data.values())),
           "best": names[int(means.argmax())], "worst": names[int(means.argmin())],
           "means": {k: float(m) for k, m in zip(names, means)},
           "drop": drop(means), "drop_ci": None, "psi": psi(means), "psi_ci": None,
           "samples": int(samples), "seed": int(seed)}
    if samples <= 0:
        return out
    rng = np.random.default_rng(seed)
    boot = np.empty((samples, len(names)))  # (samples, buckets) resampled bucket means
    for j, k in enumerate(names):
        v = data[k]
        for lo in range(0, samples, 500):  # chunks bound memory at 500 x n_b indices
            idx = rng.integers(0, len(v), size=(min(500, samples - lo), len(v)))
            boot[lo:lo + len(idx), j] = v[idx].mean(axis=1)
    hi, lo_ = boot.max(axis=1), boot.min(axis=1)
    drops = hi - lo_
    psis = np.where(hi > 0, 1 - lo_ / np.where(hi > 0, hi, 1), 0.0)
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    out["drop_ci"] = [float(x) for x in np.percentile(drops, q)]
    out["psi_ci"] = [float(x) for x in np.percentile(psis, q)]
    return out


def qa_position_bias(tables: Mapping[str, Mapping[str, str]], scores: Mapping[str, Sequence[float]], *,
                     samples: int = DEFAULT_SAMPLES, seed: int = 0) -> dict:
    """Bucketing name -> `position_bias` of per-question F1 (scores: qid -> (EM, F1) in 0..1), for
    each labelling in `tables` (bucketing -> qid -> bucket); None where it has < 2 buckets."""
    return {name: position_bias(bucket_values(labels, scores), samples=samples, seed=seed)
            for name, labels in tables.items()}


def alpha_bias(curve: Sequence[float | None]) -> dict | None:
    """Drop F1(1) − F1(k_max) and PSI over α of one α curve (F1(α), α = 1..k_max; None where a value
    is undefined). No interval: the curve holds corpus-level scores, no per-sentence counts.
    None with fewer than two defined values."""
    vals = [v for v in curve if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if len(vals) < 2:
        return None
    first, last = curve[0], curve[-1]
    return {"alphas": len(curve), "first": first, "last": last,
            "drop": None if first is None or last is None else float(first - last), "psi": psi(vals),
            "best_alpha": 1 + max(range(len(curve)), key=lambda i: -math.inf if curve[i] is None else curve[i]),
            "worst_alpha": 1 + min(range(len(curve)), key=lambda i: math.inf if curve[i] is None else curve[i])}


# ------------------------------------------------------------------------- experiments (per method)
def _segmenter_name(label: str) -> str:
    """'answer_sentence(last=4)' -> 'answer_sentence' (the store keeps the spec's label)."""
    return label.split("(", 1)[0]


def t_interval(values: Sequence[float], level: float = LEVEL) -> list[float] | None:
    """Student-t interval of the mean of `values` (over seeds); None with fewer than two."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    if len(x) < 2:
        return None
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return [float(x.mean() - half), float(x.mean() + half)]


def sized_effect(buckets: Mapping[str, tuple[int, float]], min_size: int) -> dict | None:
    """One run's front − rear effect from its bucket (size, score) pairs: buckets merged in position
    order into groups of >= `min_size` (`verdict.sized_groups`), each group's score the size-weighted
    mean of its buckets; front = first group, rear = last; PSI over the groups. None with fewer than
    two sized groups."""
    names = sorted((k for k, (n, _) in buckets.items() if n), key=lambda k: (bucket_rank(k), k))
    groups = sized_groups([buckets[k][0] for k in names], min_size)
    sized = []
    for g in groups:
        n = sum(buckets[names[i]][0] for i in g)
        if n >= min_size:
            score = sum(buckets[names[i]][0] * buckets[names[i]][1] for i in g) / n
            sized.append({"label": group_label([names[i] for i in g]), "n": int(n), "score": float(score)})
    if len(sized) < 2:
        return None
    return {"front": sized[0], "rear": sized[-1], "effect": sized[0]["score"] - sized[-1]["score"],
            "psi": psi([g["score"] for g in sized]), "groups": len(sized)}


def experiment_rows(results: dict, *, min_size: int | None = None, floor: float | None = None) -> list[dict]:
    """Per data x train size x eval set x bucketing x method: the signed front − rear effect of each
    run (`sized_effect`; tagging: F1(1) − F1(k_max) of the α curve), then its mean ± sample std over
    seeds with a t-interval over seeds, PSI likewise, and the verdict word (`verdict.evidence` of
    the seed-level interval; "too few" with one run or without two sized groups). `load_results`
    output; no bootstrap here, the spread is over seeds.

    QA: from the store's `segments` of the gold-position segmenters (QA_BUCKETINGS), "no answer" and
    empty segments left out; runs whose eval set has no `answer_sentence` segments use the
    `by_answer_sentence` of their metrics.json (default buckets). Tagging: each position evaluation's
    main-metric α curve (duplicate and shift mode), sized by its evaluated sentences. `score_mean`:
    the method's overall main metric on that eval set (F1 / accuracy), checked against `floor`."""
    min_size = MIN_BUCKET if min_size is None else min_size
    floor = QUALITY_FLOOR if floor is None else floor
    runs = {r["name"]: r for r in results["runs"] if r["status"] == "finished"}
    # (run, eval set, bucketing, kind) -> {bucket: (n, F1)} ("buckets") or the α curve ("alpha")
    per_run: dict = {}
    for s in results["segments"]:
        position = _segmenter_name(s["segmenter"]) in QA_BUCKETINGS
        if s["run"] in runs and position and s["segment"] != NO_ANSWER and s["n"]:
            per_run.setdefault((s["run"], s["eval_set"], s["segmenter"], "buckets"), {})[s["segment"]] = (s["n"], s["f1"])
    have_sentence = {(r, e) for r, e, b, _ in per_run if _segmenter_name(b) == "answer_sentence"}
    sizes: dict = {}
    for name, r in runs.items():
        for eval_set, m in r["metrics"].items():
            by = m.get("by_answer_sentence")
            if by and (name, eval_set) not in have_sentence:
                per_run[(name, eval_set, "answer_sentence", "buckets")] = {
                    k: (v["total"], v["f1"]) for k, v in by.items() if k != NO_ANSWER and v["total"]}
            key = m.get("metric")
            for tag, mode in (("", "duplicate"), ("shift_", "shift")):
                if key and f"{tag}{key}_by_alpha" in m:
                    label = f"{'F1' if key == 'f1' else key}(α), {mode}"
                    per_run[(name, eval_set, label, "alpha")] = m[f"{tag}{key}_by_alpha"]
                    sizes[(name, eval_set)] = m.get("evaluated_sentences")
    values: dict = {}
    for (name, eval_set, bucketing, kind), v in per_run.items():
        r = runs[name]
        if kind == "alpha":
            b = alpha_bias(v)
            n = sizes.get((name, eval_set))
            point = (None if b is None or b["drop"] is None or (n is not None and n < min_size) else
                     {"effect": b["drop"], "psi": b["psi"], "front": {"label": "copy 1", "n": n, "score": v[0]},
                      "rear": {"label": f"copy {len(v)}", "n": n, "score": v[-1]}})
        else:
            point = sized_effect(v, min_size)
        key = (r["dataset"], r["train_size"], eval_set, bucketing, kind)
        values.setdefault(key, {}).setdefault(r["method"], []).append((point, _main_score(r["metrics"].get(eval_set)),
                                                                        r["seed"]))
    rows = []
    for (dataset, size, eval_set, bucketing, kind), by_method in sorted(values.items(), key=lambda kv: str(kv[0])):
        order = [m for m in results["methods"] if m in by_method] + sorted(set(by_method) - set(results["methods"]))
        for method in order:
            pts = [p for p, _, _ in by_method[method] if p is not None]
            score, _ = mean_std([sc for _, sc, _ in by_method[method] if sc is not None])
            row = {"dataset": dataset, "train_size": size, "eval_set": eval_set, "bucketing": bucketing,
                   "kind": kind, "method": method, "n_runs": len(pts), "runs_without_groups": len(by_method[method]) - len(pts),
                   "front": pts[0]["front"]["label"] if pts else None, "rear": pts[0]["rear"]["label"] if pts else None,
                   "front_n": pts[0]["front"]["n"] if pts else None, "rear_n": pts[0]["rear"]["n"] if pts else None,
                   "min_size": min_size, "score_mean": score, "floor": floor,
                   "below_floor": bool(score == score and score < floor)}
            em, es = mean_std([p["effect"] for p in pts])
            pm, ps = mean_std([p["psi"] for p in pts])
            ci = t_interval([p["effect"] for p in pts])
            row.update(effect_mean=em, effect_std=es, effect_ci=ci, psi_mean=pm, psi_std=ps,
                       evidence=evidence(em, ci, enough=len(pts) >= 2),
                       by_seed={str(seed): {"effect": p["effect"], "front": p["front"].get("score"),
                                            "rear": p["rear"].get("score"), "groups": [p["front"]["label"],
                                                                                      p["rear"]["label"]]}
                                for p, _, seed in by_method[method] if p is not None})
            rows.append(row)
    return rows


def gap_rows(rows: list[dict], baseline: str) -> list[dict]:
    """The change of the position gap against the baseline, a method's position-bias effect: per bucketing x
    method (not the baseline), paired by seed over the seeds whose front and rear groups are the baseline's,
    the difference in differences (method − baseline) of front − rear, and the method − baseline change of the
    front and of the rear score, each with its mean and 95% t-interval over seeds. A method that removes
    position bias has a negative gap change; how it got there (the rear raised, or the front lowered) is in
    the two sides. Rows of `experiment_rows`."""
    base = {(r["dataset"], r["train_size"], r["eval_set"], r["bucketing"], r["kind"]): r
            for r in rows if r["method"] == baseline}
    out = []
    for r in rows:
        b = base.get((r["dataset"], r["train_size"], r["eval_set"], r["bucketing"], r["kind"]))
        if r["method"] == baseline or b is None:
            continue
        seeds = sorted(s for s in set(r["by_seed"]) & set(b["by_seed"])
                       if r["by_seed"][s]["groups"] == b["by_seed"][s]["groups"]
                       and None not in (r["by_seed"][s]["front"], b["by_seed"][s]["front"]))
        if not seeds:
            continue
        row = {k: r[k] for k in ("dataset", "train_size", "eval_set", "bucketing", "kind", "method", "front", "rear")}
        row["seeds"] = len(seeds)
        for name, key in (("gap_change", "effect"), ("front_change", "front"), ("rear_change", "rear")):
            d = [r["by_seed"][s][key] - b["by_seed"][s][key] for s in seeds]
            mean, std = mean_std(d)
            row[name] = {"mean": mean, "std": std, "ci": t_interval(d) if len(d) > 1 else None}
        row["reduces_bias"] = evidence(row["gap_change"]["mean"], row["gap_change"]["ci"], enough=len(seeds) >= 2)
        out.append(row)
    return out


def _main_score(m: dict | None) -> float | None:
    """A run's overall main metric on one eval set, in points (QA F1, NER F1, POS accuracy)."""
    if not m:
        return None
    for key in (m.get("metric"), "f1", "accuracy"):
        if key and isinstance(m.get(key), (int, float)):
            return float(m[key])
    return None
