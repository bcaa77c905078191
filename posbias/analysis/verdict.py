"""The position-bias verdict: a signed, sized, tested effect along position, then one sentence.

Every diagnosis (QA, tagging) and experiment report opens with it. The rules, in one place:

* **Sized buckets.** Position buckets (quarters of the window, answer sentences) hold very different
  numbers of examples: on SQuAD most answers sit in the first quarter. A bucket of 6 questions has a
  mean that moves by tens of F1 points by chance, so adjacent buckets, in position order, are merged
  until each holds at least `min_size` examples (default `MIN_BUCKET` = 30; `sized_groups`). No
  headline number and no PSI comes from a smaller bucket.
* **A signed headline.** The effect is front minus rear: the score of the first sized group minus
  that of the last one, so it is positive when later positions score lower (a position bias) and
  negative when they score higher. "Best minus worst" is not used: it is never negative, biased
  upwards by noise, and says nothing about direction.
* **A trend.** The least-squares slope of the per-example score over position (QA: per 100 tokens of
  the gold answer start, or per answer sentence; tagging: per copy α), with a bootstrap interval and,
  where examples can be exchanged across positions, a two-sided permutation p-value.
* **The verdict** (`evidence`): "yes" when the 95% interval of front − rear lies above 0, "reversed"
  when it lies below 0 (later positions score higher), "no" when it covers 0, "too few" when fewer
  than two sized groups exist. Only the front − rear interval decides (one test, no search over
  statistics); the trend and PSI are reported beside it.
* **A quality floor.** A model whose overall score is below `QUALITY_FLOOR` points (F1 or accuracy)
  gets a warning: near zero, every bucket scores near zero and PSI = 1 − min/max is noise.

Intervals: percentile bootstrap (`DEFAULT_SAMPLES` resamples, NumPy generator with a fixed seed).
QA resamples questions within each group (the segmentation is given by the gold answers, so group
sizes stay fixed); tagging resamples sentences, which are the same at every copy α (paired).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

MIN_BUCKET = 30
"""Fewest examples (questions, sentences) a position bucket needs to stand on its own."""
QUALITY_FLOOR = 20.0
"""Overall score (points of F1 / accuracy) under which position-bias numbers mean little."""
DEFAULT_SAMPLES = 2000
LEVEL = 0.95
EVIDENCE = ("yes", "no", "reversed", "too few")


# ------------------------------------------------------------------------------------------- buckets
def check_verdict_options(bootstrap_samples, min_bucket, quality_floor) -> None:
    """The verdict's options every diagnosis takes, refused in one line when out of range."""
    from ..errors import ConfigError

    if isinstance(bootstrap_samples, bool) or not isinstance(bootstrap_samples, int) or bootstrap_samples < 0:
        raise ConfigError(f"diagnose: bootstrap_samples must be an integer >= 0, got {bootstrap_samples!r}")
    if isinstance(min_bucket, bool) or not isinstance(min_bucket, int) or min_bucket < 1:
        raise ConfigError(f"diagnose: min_bucket must be a positive integer, got {min_bucket!r}")
    if isinstance(quality_floor, bool) or not isinstance(quality_floor, (int, float)) or not 0 <= quality_floor <= 100:
        raise ConfigError(f"diagnose: quality_floor must be a number of points in 0..100, got {quality_floor!r}")


def psi(means: Sequence[float]) -> float:
    """Position sensitivity index 1 − min/max (Zeng et al. 2025); 0 when the best bucket scores 0."""
    x = np.asarray(means, dtype=np.float64)
    hi = x.max()
    return float(1 - x.min() / hi) if hi > 0 else 0.0


def bucket_rank(label: str) -> float:
    """Position order of a bucket label: its first integer ("Q3 [192,288)" -> 3, "5+" -> 5, "S100(2)" -> 100);
    labels without one sort last."""
    m = re.search(r"\d+", str(label))
    return float(m.group()) if m else math.inf


def sized_groups(sizes: Sequence[int], min_size: int = MIN_BUCKET) -> list[list[int]]:
    """Indices of ordered buckets grouped so that every group holds >= `min_size` examples.

    Walking from the front, buckets join the open group until it is large enough; a remainder too
    small to stand alone joins the last group. Empty buckets are left out. With fewer than
    `min_size` examples in all there is one (undersized) group.

    >>> sized_groups([300, 20, 15, 5], 30)
    [[0], [1, 2, 3]]
    """
    groups: list[list[int]] = []
    current: list[int] = []
    count = 0
    for i, n in enumerate(sizes):
        if n <= 0:
            continue
        current.append(i)
        count += n
        if count >= min_size:
            groups.append(current)
            current, count = [], 0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


_RANGE = re.compile(r"^(\S+) \[(\d+),(\d+)\)$")


def group_label(names: Sequence[str]) -> str:
    """One label for merged buckets: "Q2 [96,192)" + "Q3 [192,288)" -> "Q2–Q3 [96,288)"; "3", "4", "5+" -> "3–5+"."""
    if len(names) == 1:
        return str(names[0])
    first, last = _RANGE.match(str(names[0])), _RANGE.match(str(names[-1]))
    if first and last:
        return f"{first.group(1)}–{last.group(1)} [{first.group(2)},{last.group(3)})"
    return f"{names[0]}–{names[-1]}"


def merge_buckets(buckets: Mapping[str, Sequence[float]], min_size: int = MIN_BUCKET) -> tuple[dict, dict]:
    """Ordered buckets (label -> per-example scores) merged into sized groups.

    Returns (group label -> concatenated scores, group label -> the bucket labels it holds), both in
    position order (`bucket_rank`)."""
    names = sorted((k for k, v in buckets.items() if len(v)), key=lambda k: (bucket_rank(k), str(k)))
    groups = sized_groups([len(buckets[k]) for k in names], min_size)
    values, members = {}, {}
    for g in groups:
        label = group_label([names[i] for i in g])
        values[label] = np.concatenate([np.asarray(buckets[names[i]], dtype=np.float64) for i in g])
        members[label] = [names[i] for i in g]
    return values, members


# ------------------------------------------------------------------------------------------ effects
def _percentile_ci(x: np.ndarray, level: float) -> list[float]:
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    return [float(v) for v in np.percentile(x, q)]


def front_rear(front: Sequence[float], rear: Sequence[float], *, samples: int = DEFAULT_SAMPLES, seed: int = 0,
               level: float = LEVEL) -> dict:
    """mean(front) − mean(rear) with a bootstrap interval, each group resampled within itself.

    Returns {"effect", "ci"} (ci None with 0 samples)."""
    f, r = np.asarray(front, dtype=np.float64), np.asarray(rear, dtype=np.float64)
    out = {"effect": float(f.mean() - r.mean()), "ci": None}
    if samples <= 0:
        return out
    rng = np.random.default_rng(seed)
    diffs = np.empty(samples)
    for lo in range(0, samples, 500):  # chunks bound memory at 500 x n indices
        m = min(500, samples - lo)
        diffs[lo:lo + m] = (f[rng.integers(0, len(f), size=(m, len(f)))].mean(axis=1)
                            - r[rng.integers(0, len(r), size=(m, len(r)))].mean(axis=1))
    out["ci"] = _percentile_ci(diffs, level)
    return out


def _slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of each row of y (.., n) on each row of x (.., n)."""
    xc = x - x.mean(axis=-1, keepdims=True)
    var = (xc * xc).sum(axis=-1)
    return np.where(var > 0, (xc * (y - y.mean(axis=-1, keepdims=True))).sum(axis=-1) / np.where(var > 0, var, 1), 0.0)


def trend(x: Sequence[float], y: Sequence[float], *, per: float = 1.0, samples: int = DEFAULT_SAMPLES, seed: int = 0,
          level: float = LEVEL, permutation: bool = True) -> dict | None:
    """Least-squares slope of score `y` over position `x`, times `per` (e.g. per 100 tokens).

    Interval: percentile bootstrap of (x, y) pairs. p: two-sided permutation test (scores shuffled
    against positions, `samples` permutations, p = (1 + #|slope*| >= |slope|) / (1 + samples)), the
    null being a position-blind model. None when x does not vary (no slope to fit)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    slope = float(_slopes(x, y)) * per
    out = {"slope": slope, "per": per, "ci": None, "p": None, "n": int(len(x))}
    if samples <= 0:
        return out
    rng = np.random.default_rng(seed)
    boot, perm = np.empty(samples), np.empty(samples if permutation else 0)
    n = len(x)
    xc = x - x.mean()
    var = float(xc @ xc)
    for lo in range(0, samples, 200):
        m = min(200, samples - lo)
        idx = rng.integers(0, n, size=(m, n))
        boot[lo:lo + m] = _slopes(x[idx], y[idx]) * per
        if permutation:  # the slope of shuffled scores: sum(xc * y_perm) / sum(xc^2), x's mean fixed
            perm[lo:lo + m] = rng.permuted(np.broadcast_to(y, (m, n)), axis=1) @ xc / var * per
    out["ci"] = _percentile_ci(boot, level)
    if permutation:
        out["p"] = float((1 + np.sum(np.abs(perm) >= abs(slope) - 1e-12 * max(1.0, abs(slope)))) / (1 + samples))
    return out


def evidence(effect: float, ci: Sequence[float] | None, enough: bool = True) -> str:
    """The verdict word (module docstring): "too few", "yes", "reversed" or "no"."""
    if not enough or effect is None or (isinstance(effect, float) and math.isnan(effect)):
        return "too few"
    if ci is None:
        return "no"
    if ci[0] > 0:
        return "yes"
    if ci[1] < 0:
        return "reversed"
    return "no"


def quality(score: float | None, floor: float = QUALITY_FLOOR, metric: str = "F1") -> dict:
    """{"score", "floor", "metric", "below"}: whether the model is too weak for its bias to mean much."""
    below = score is not None and not math.isnan(score) and score < floor
    return {"score": score, "floor": floor, "metric": metric, "below": bool(below)}


# --------------------------------------------------------------------------------------------- QA axes
def position_axis(labels: Mapping[str, str], scores: Mapping[str, float], *, positions: Mapping[str, float] | None = None,
                  per: float = 1.0, unit: str = "bucket", name: str = "", min_size: int = MIN_BUCKET,
                  samples: int = DEFAULT_SAMPLES, seed: int = 0, level: float = LEVEL) -> dict:
    """The verdict along one position axis of per-example scores (QA: questions, F1 in points).

    Args:
        labels: example -> its position bucket (ordered by `bucket_rank`); examples without one are left out.
        scores: example -> score in points.
        positions: example -> position for the trend (default: the bucket's rank).
        per, unit: the trend is reported per `per` `unit`s (e.g. 100 tokens).
        name: what the axis is, for the sentence ("answer position").
    Returns a dict: buckets (label, n, score) in order, groups after merging (label, members, n,
    score), front/rear groups, effect (front − rear) and its interval, trend, evidence, PSI of the
    sized groups (with interval), min_size, samples, seed.
    """
    ids = [q for q in labels if q in scores]
    raw: dict[str, list[float]] = {}
    for q in ids:
        raw.setdefault(str(labels[q]), []).append(float(scores[q]))
    order = sorted(raw, key=lambda k: (bucket_rank(k), k))
    buckets = [{"label": k, "n": len(raw[k]), "score": float(np.mean(raw[k]))} for k in order]
    values, members = merge_buckets(raw, min_size)
    groups = [{"label": k, "members": members[k], "n": int(len(v)), "score": float(v.mean()),
               "sized": bool(len(v) >= min_size)} for k, v in values.items()]
    out = {"name": name, "examples": len(ids), "buckets": buckets, "groups": groups, "min_size": min_size,
           "samples": int(samples), "seed": int(seed), "level": level, "front": None, "rear": None,
           "effect": None, "ci": None, "trend": None, "psi": None, "psi_ci": None}
    sized = [g for g in groups if g["sized"]]
    if len(sized) >= 2:
        front, rear = sized[0], sized[-1]
        fr = front_rear(values[front["label"]], values[rear["label"]], samples=samples, seed=seed, level=level)
        out.update(front=front, rear=rear, effect=fr["effect"], ci=fr["ci"])
        means = [g["score"] for g in sized]
        out["psi"] = psi(means)
        if samples > 0:
            out["psi_ci"] = _psi_interval([values[g["label"]] for g in sized], samples, seed + 1, level)
    x = [float(positions[q]) if positions is not None else bucket_rank(labels[q]) for q in ids
         if positions is None or q in positions]
    y = [float(scores[q]) for q in ids if positions is None or q in positions]
    out["trend"] = trend(x, y, per=per, samples=samples, seed=seed + 2, level=level)
    if out["trend"] is not None:
        out["trend"]["unit"] = unit
    out["evidence"] = evidence(out["effect"], out["ci"], enough=out["front"] is not None)
    return out


def _psi_interval(groups: list[np.ndarray], samples: int, seed: int, level: float) -> list[float]:
    rng = np.random.default_rng(seed)
    boot = np.empty((samples, len(groups)))
    for j, v in enumerate(groups):
        for lo in range(0, samples, 500):
            m = min(500, samples - lo)
            boot[lo:lo + m, j] = v[rng.integers(0, len(v), size=(m, len(v)))].mean(axis=1)
    hi, lo_ = boot.max(axis=1), boot.min(axis=1)
    return _percentile_ci(np.where(hi > 0, 1 - lo_ / np.where(hi > 0, hi, 1), 0.0), level)


# ---------------------------------------------------------------------------------------- tagging α
def ratio_points(sums: np.ndarray) -> np.ndarray:
    """100 x numerator / denominator over the last axis (.., 2); 0 where the denominator is 0 (as
    `tagging.metrics`: no entity predicted or gold gives F1 0)."""
    num, den = sums[..., 0], sums[..., 1]
    return 100 * np.divide(num, den, out=np.zeros(np.shape(num), dtype=np.float64), where=den > 0)


def alpha_curves(cells: Sequence[tuple[int, int]], counts: np.ndarray, *, samples: int = 0, seed: int = 0):
    """The α curve of a ratio metric and its bootstrap replicates over sentences.

    Args:
        cells: (k, α) of each cell, as `tagging.duplicated` scores them (duplicate mode: α <= k;
            shift mode: one cell per α).
        counts: (cells, n, 2) per sentence the (numerator, denominator) of the metric in each cell
            (NER F1: 2 TP, predicted + gold entities; POS accuracy: correct words, words), so that
            sums over sentences give the cell's corpus score.
    Returns (α values, (α,) curve M(α) = mean over the cells of that α (the paper's tables), and
    (samples, α) replicates: sentences drawn with replacement, the same draw for every cell (paired)).
    """
    counts = np.asarray(counts, dtype=np.float64)
    alphas = sorted({a for _, a in cells})
    cell_alpha = np.array([a for _, a in cells])
    n = counts.shape[1]
    # (α, cells) averaging matrix: row α averages the cells of that α (mean over k >= α)
    avg = np.stack([(cell_alpha == a) / max(1, int(np.sum(cell_alpha == a))) for a in alphas])

    def curve(sums):  # sums (.., cells, 2) -> (.., α)
        return ratio_points(sums) @ avg.T

    point = curve(counts.sum(axis=1))
    boot = np.empty((max(0, samples), len(alphas)))
    if samples > 0 and n > 0:
        rng = np.random.default_rng(seed)
        flat = counts.transpose(1, 0, 2).reshape(n, -1)  # (n, cells * 2)
        for lo in range(0, samples, 250):
            m = min(250, samples - lo)
            w = np.stack([np.bincount(rng.integers(0, n, size=n), minlength=n) for _ in range(m)]).astype(np.float64)
            boot[lo:lo + m] = curve((w @ flat).reshape(m, len(cells), 2))
    return alphas, point, boot


def alpha_axis(cells: Sequence[tuple[int, int]], counts: np.ndarray, *, min_size: int = MIN_BUCKET,
               samples: int = DEFAULT_SAMPLES, seed: int = 0, level: float = LEVEL) -> dict | None:
    """The verdict along the copy axis α of the duplicated test sets (Ben Amor et al.).

    `cells` and `counts` as `alpha_curves`. Returns the curve M(α) with a bootstrap interval per α,
    front = copy 1, rear = the last copy, the effect M(1) − M(α_max) with its interval, the trend of
    M(α) per copy with its interval, PSI over α with its interval, evidence; None without cells.
    With fewer than `min_size` sentences: "too few".
    """
    if not len(cells):
        return None
    alphas, point, boot = alpha_curves(cells, counts, samples=samples, seed=seed)
    n = int(np.shape(counts)[1])
    a = np.asarray(alphas, dtype=np.float64)
    several = len(alphas) > 1
    out = {"alphas": alphas, "curve": [float(v) for v in point], "curve_ci": None, "sentences": n,
           "min_size": min_size, "samples": int(samples), "seed": int(seed), "level": level,
           "front": {"label": f"copy {alphas[0]}", "n": n, "score": float(point[0])},
           "rear": {"label": f"copy {alphas[-1]}", "n": n, "score": float(point[-1])},
           "effect": float(point[0] - point[-1]) if several else None, "ci": None,
           "trend": ({"slope": float(_slopes(a, point)), "per": 1.0, "unit": "copy", "ci": None, "p": None, "n": n}
                     if several else None),
           "psi": psi(point) if several else None, "psi_ci": None}
    if len(boot) and several:
        out["curve_ci"] = [_percentile_ci(boot[:, j], level) for j in range(len(alphas))]
        out["ci"] = _percentile_ci(boot[:, 0] - boot[:, -1], level)
        out["trend"]["ci"] = _percentile_ci(_slopes(np.broadcast_to(a, boot.shape), boot), level)
        hi, lo_ = boot.max(axis=1), boot.min(axis=1)
        out["psi_ci"] = _percentile_ci(np.where(hi > 0, 1 - lo_ / np.where(hi > 0, hi, 1), 0.0), level)
    out["evidence"] = evidence(out["effect"], out["ci"], enough=n >= min_size and several)
    return out


def curve_intervals(cells, counts, *, samples: int = DEFAULT_SAMPLES, seed: int = 0, level: float = LEVEL) -> list | None:
    """Per α the bootstrap interval of a ratio metric's α curve (`alpha_curves`); None without resamples."""
    alphas, _, boot = alpha_curves(cells, counts, samples=samples, seed=seed)
    return [_percentile_ci(boot[:, j], level) for j in range(len(alphas))] if len(boot) else None


# ------------------------------------------------------------------------------------------- words
def minus_signed(x: float, digits: int = 1) -> str:
    """`x` with `digits` decimals and a true minus sign (U+2212), as every verdict line prints it."""
    return f"{x:.{digits}f}".replace("-", "−")


def ci_words(ci, digits: int = 1, flip: bool = False) -> str:
    """A (low, high) interval as "95% CI a to b" (`flip`: of the negated effect); none: "no interval"."""
    if not ci:
        return "no interval"
    lo, hi = (-ci[1], -ci[0]) if flip else ci
    return f"95% CI {minus_signed(lo, digits)} to {minus_signed(hi, digits)}"


EVIDENCE_WORDS = {"yes": "yes", "no": "no", "reversed": "no (the reverse: later positions score higher)",
                  "too few": "too few examples to tell"}


def sentence(v: dict | None, *, metric: str = "F1", what: str = "answers", where: str = "", prefix: str = "") -> str:
    """The verdict in one sentence, e.g. "Rear answers (Q2–Q3 [96,288), n=103) score 1.2 F1 lower than
    front ones (Q1 [0,96), n=330) [95% CI −6.5 to 8.9]; evidence of position bias: no.".

    Args:
        what: the examples ("answers"); prefix: put before group labels ("sentence "); where: a
            qualifier after the sizes ("duplicate mode")."""
    if v is None:
        return "No position axis to compare."
    if v.get("front") is None or v.get("effect") is None:
        n = v.get("examples", v.get("sentences", 0))
        return (f"Too few {what} to tell: {n:,} in all, fewer than two position groups of at least "
                f"{v['min_size']} (evidence of position bias: too few examples to tell).")
    f, r = v["front"], v["rear"]
    e = v["effect"]
    word = "lower" if e >= 0 else "higher"
    if "curve" in v:  # tagging: the same sentences at every copy
        place = f", {where}" if where else ""
        head = (f"Copy {r['label'].split()[-1]} scores {minus_signed(abs(e))} {metric} {word} than copy "
                f"{f['label'].split()[-1]} ({f['n']:,} sentences{place}) [{ci_words(v['ci'], flip=e < 0)}]")
        if v["evidence"] == "too few":
            head += f"; fewer than {v['min_size']} sentences"
    else:
        head = (f"Rear {what} ({prefix}{r['label']}, n={r['n']:,}) score {minus_signed(abs(e))} {metric} {word} than front "
                f"ones ({prefix}{f['label']}, n={f['n']:,}) [{ci_words(v['ci'], flip=e < 0)}]")
    return f"{head}; evidence of position bias: {EVIDENCE_WORDS[v['evidence']]}."


def trend_text(t: dict | None, metric: str = "F1") -> str:
    """"trend −0.9 F1 per 100 tokens [95% CI −4.0 to 2.1], permutation p 0.62"."""
    if not t:
        return "trend: –"
    per = t["per"]
    unit = t.get("unit", "")
    per_text = f"per {per:g} {unit}s" if per != 1 else f"per {unit}"
    text = f"trend {minus_signed(t['slope'], 2)} {metric} {per_text}"
    if t.get("ci"):
        text += f" [{ci_words(t['ci'], 2)}]"
    if t.get("p") is not None:
        text += f", permutation p {_p(t['p'])}"
    return text


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def psi_text(v: dict | None) -> str:
    if not v or v.get("psi") is None:
        return "PSI: –"
    ci = v.get("psi_ci")
    groups = len(v["curve"]) if "curve" in v else sum(g["sized"] for g in v["groups"])
    over = f"{groups} copies" if "curve" in v else f"{groups} sized groups"
    return f"PSI {v['psi']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") + f" over {over}"


def merged_text(v: dict | None) -> str:
    """"" or "buckets under 30 merged: Q3 [192,288) (6) into Q2–Q3 [96,288)"."""
    if not v or "groups" not in v:
        return ""
    parts = []
    sizes = {b["label"]: b["n"] for b in v["buckets"]}
    for g in v["groups"]:
        if len(g["members"]) > 1:
            small = [m for m in g["members"] if sizes[m] < v["min_size"]]
            parts.append(f"{', '.join(f'{m} ({sizes[m]})' for m in small or g['members'])} into {g['label']}")
        elif not g["sized"]:
            parts.append(f"{g['label']} ({g['n']}) stands alone, under {v['min_size']}")
    return f"buckets under {v['min_size']} examples merged: " + "; ".join(parts) if parts else ""


def quality_text(q: dict) -> str:
    if not q or not q["below"]:
        return ""
    return (f"Warning: overall {q['metric']} {q['score']:.1f} is below the quality floor of {q['floor']:g}: "
            "a model this weak scores near 0 everywhere, so its position-bias numbers mean little.")


# ------------------------------------------------------------------------------------------ blocks
VERDICT_HEAD = ["axis", "front", "rear", "front − rear [95% CI]", "trend [95% CI], permutation p", "PSI [95% CI]",
                "evidence"]
"""The verdict table's columns (tagging: its trend has no permutation p, the column says "trend [95% CI]")."""


def _side(g: dict | None, metric: str) -> str:
    return "–" if g is None else f"{g['label']} (n={g['n']:,}): {g['score']:.1f}"


def table_row(axis: str, v: dict | None, metric: str = "F1") -> list[str]:
    """One row of the verdict table (`VERDICT_HEAD`) for one axis."""
    if v is None:
        return [axis, "–", "–", "–", "–", "–", "too few"]
    eff = "–" if v.get("effect") is None else minus_signed(v["effect"], 2) + (
        f" [{minus_signed(v['ci'][0], 2)}, {minus_signed(v['ci'][1], 2)}]" if v.get("ci") else "")
    t = v.get("trend")
    tr = "–"
    if t:
        per = "" if t["per"] == 1 else f"{t['per']:g} "
        tr = f"{minus_signed(t['slope'], 2)} per {per}{t.get('unit', '')}{'s' if t['per'] != 1 else ''}"
        if t.get("ci"):
            tr += f" [{minus_signed(t['ci'][0], 2)}, {minus_signed(t['ci'][1], 2)}]"
        if t.get("p") is not None:
            tr += f", p {_p(t['p'])}"
    ps = "–" if v.get("psi") is None else f"{v['psi']:.3f}" + (
        f" [{v['psi_ci'][0]:.3f}, {v['psi_ci'][1]:.3f}]" if v.get("psi_ci") else "")
    return [axis, _side(v.get("front"), metric), _side(v.get("rear"), metric), eff, tr, ps, v.get("evidence", "too few")]


def headline(axes: list[tuple[str, dict | None, dict]]) -> str:
    """The first axis's sentence (`sentence`, its options in the triple)."""
    name, v, opts = axes[0]
    return sentence(v, **opts)


def report_line(output_dir, plots: int) -> str:
    """The terminal's last line: where the whole report is."""
    return (f"report: {output_dir}/diagnosis.md (also diagnosis.html, diagnosis.json, {plots} plot(s); --verbose "
            "prints it here)")


def terminal_block(title: str, axes: list[tuple[str, dict | None, dict]], q: dict, report: str,
                   metric: str = "F1") -> list[str]:
    """What the terminal shows of a diagnosis: the title, the verdict sentence of each axis with its
    trend and PSI, merged buckets, the quality warning, and where the full report is."""
    lines = [title]
    warn = quality_text(q)
    if warn:
        lines.append("  " + warn)
    for i, (name, v, opts) in enumerate(axes):
        lines.append(f"  {name}: {sentence(v, **opts)}")
        if v is not None and v.get("front") is not None:
            extra = [trend_text(v.get("trend"), metric), psi_text(v)]
            lines.append("    " + "; ".join(extra))
        m = merged_text(v)
        if m:
            lines.append("    " + m)
    lines.append(report)
    return lines


def note(min_size: int, samples: int, how: str = "", permutation: bool = True, buckets: bool = True) -> str:
    """What the verdict block's numbers are (QA: `buckets` merged to size; tagging: copies, all of one size)."""
    text = ("Front − rear: the score of the first position group minus that of the last, in points (positive: later "
            "positions score lower). ")
    if buckets:
        text += (f"Buckets are merged with their neighbours, in position order, until each holds at least {min_size} "
                 "examples; smaller buckets never set a headline or PSI. ")
    text += ("Evidence of position bias: \"yes\" when the 95% interval of front − rear lies above 0, \"reversed\" "
             "when below 0 (later positions score higher), \"no\" when it covers 0, \"too few\" "
             + (f"without two groups of {min_size}" if buckets else f"under {min_size} sentences") + ". "
             "Trend: least-squares slope of the score over position, bootstrap interval"
             + (" and two-sided permutation p-value (scores shuffled across positions)" if permutation else "")
             + ". PSI = 1 − worst/best over the " + ("sized groups" if buckets else "copies")
             + f" (0: flat, 1: one at 0). Intervals: percentile bootstrap, {samples:,} resamples, fixed seed{how}.")
    return text
