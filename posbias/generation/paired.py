"""The position verdict for paired scores: every question scored with its gold document at every
position, so differences between positions are taken within a question and intervals resample
questions (a percentile bootstrap over the rows of a (q, k) score matrix).

What is reported, in points (the per-question score: Liu et al.'s accuracy, SQuAD EM/F1, or the
answer's per-token probability for the log-likelihood scoring):

- the **curve**: the mean score at each position 1..k, with its interval;
- **first − last** (the signed headline shared by every posbias diagnosis: positive when the last
  position scores lower) and its interval, which alone decides the verdict word
  (`posbias.analysis.verdict.evidence`);
- the **U-shape** as Liu et al. describe it: the mean of the middle positions (2..k − 1) minus the
  better of the two edges (the edge with the higher mean score; chosen on the data, said in the
  output), paired by question: negative when the middle is lost;
- the **trend**: the mean over questions of each question's least-squares slope over position (per
  position), with its interval;
- **PSI** = 1 − worst/best position mean (Zeng et al.), with its interval.

A mitigation is compared with the unmodified model on the same questions and gold positions
(`paired_difference`): its score minus the original's, averaged over questions and positions, and
per position.

Shape legend: q questions, k positions, r bootstrap resamples in one chunk.
"""
from __future__ import annotations

import numpy as np

from ..analysis import verdict as V

CHUNK = 256
"""Bootstrap resamples drawn at a time: bounds memory at CHUNK x q indices."""


def _ci(x: np.ndarray, level: float) -> list[float]:
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    return [float(v) for v in np.percentile(x, q)]


def _slopes(scores: np.ndarray) -> np.ndarray:
    """(q,) least-squares slope of each question's scores over positions 1..k (per position)."""
    k = scores.shape[-1]
    x = np.arange(1, k + 1, dtype=np.float64) - (k + 1) / 2
    return (scores - scores.mean(axis=-1, keepdims=True)) @ x / float(x @ x)


def _stats(s: np.ndarray, edge: int) -> np.ndarray:
    """(r, 4 + k) statistics of resampled score matrices s (r, q, k): first − last, middle − edge
    (`edge` 0 or k − 1), mean slope, PSI, then the k position means."""
    means = s.mean(axis=1)  # (r, k)
    k = s.shape[-1]
    first_last = means[:, 0] - means[:, -1]
    middle = means[:, 1:k - 1].mean(axis=1) - means[:, edge] if k > 2 else np.full(len(s), np.nan)
    slope = _slopes(s).mean(axis=1)
    hi, lo = means.max(axis=1), means.min(axis=1)
    psi = np.where(hi > 0, 1 - lo / np.where(hi > 0, hi, 1), 0.0)
    return np.column_stack([first_last, middle, slope, psi, means])


def _bootstrap(stats, s: np.ndarray, samples: int, seed: int, level: float):
    """`stats` (r, q, k) -> (r, j) on the matrix itself and on `samples` resamples of its rows
    (questions): (the j point values, a function giving statistic j's percentile interval, or None
    without resamples)."""
    q = len(s)
    point = stats(s[None])[0]
    if samples <= 0 or q < 2:
        return point, lambda j: None
    rng = np.random.default_rng(seed)
    boot = np.empty((samples, len(point)))
    for lo in range(0, samples, CHUNK):
        m = min(CHUNK, samples - lo)
        boot[lo:lo + m] = stats(s[rng.integers(0, q, size=(m, q))])  # (r, q, k) resampled rows
    return point, lambda j: _ci(boot[:, j], level)


def mean_interval(scores: np.ndarray, *, samples: int = V.DEFAULT_SAMPLES, seed: int = 0,
                  level: float = V.LEVEL) -> dict:
    """The mean of per-question scores (q,) with its percentile bootstrap interval over questions
    ({"score", "ci", "n"}; ci None without resamples or with fewer than two questions)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    point, ci = _bootstrap(lambda r: r.mean(axis=1), s, samples, seed, level)
    return {"score": float(point[0]), "ci": ci(0), "n": int(len(s))}


def position_verdict(scores: np.ndarray, *, samples: int = V.DEFAULT_SAMPLES, seed: int = 0,
                     level: float = V.LEVEL, min_size: int = V.MIN_BUCKET) -> dict:
    """The verdict of a (q, k) matrix of per-question scores in points (module docstring).

    Returns a dict that `posbias.analysis.verdict.table_row` reads (front, rear, effect, ci, trend,
    psi, psi_ci, evidence) plus `curve` (position, n, score, ci), `u_shape` (middle, edge, effect,
    ci) and `questions`. Fewer than `min_size` questions or k < 2: evidence "too few"."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"scores must be (questions, positions), got shape {s.shape}")
    q, k = s.shape
    out = {"questions": int(q), "k": int(k), "min_size": min_size, "samples": int(samples), "seed": int(seed),
           "level": level, "curve": [], "front": None, "rear": None, "effect": None, "ci": None, "trend": None,
           "psi": None, "psi_ci": None, "u_shape": None, "evidence": "too few"}
    if q == 0 or k == 0:
        return out
    means = s.mean(axis=0)
    edge = 0 if means[0] >= means[-1] else k - 1
    point, ci = _bootstrap(lambda x: _stats(x, edge), s, samples, seed, level)
    out["curve"] = [{"position": p + 1, "n": int(q), "score": float(means[p]), "ci": ci(4 + p)} for p in range(k)]
    if k < 2:
        return out
    out["front"] = {"label": "position 1", "n": int(q), "score": float(means[0])}
    out["rear"] = {"label": f"position {k}", "n": int(q), "score": float(means[-1])}
    out["effect"], out["ci"] = float(point[0]), ci(0)
    out["trend"] = {"slope": float(point[2]), "per": 1.0, "unit": "position", "ci": ci(2), "p": None, "n": int(q)}
    out["psi"], out["psi_ci"] = float(point[3]), ci(3)
    if k > 2:
        out["u_shape"] = {"middle": float(means[1:k - 1].mean()), "edge": "first" if edge == 0 else "last",
                          "edge_score": float(means[edge]), "effect": float(point[1]), "ci": ci(1)}
    out["evidence"] = V.evidence(out["effect"], out["ci"], enough=q >= min_size)
    return out


def paired_difference(mitigated: np.ndarray, original: np.ndarray, *, samples: int = V.DEFAULT_SAMPLES,
                      seed: int = 0, level: float = V.LEVEL) -> dict:
    """A mitigation's (q, k) scores minus the original's on the same questions and gold positions:
    the mean over all of them, per position, and over the middle positions (2..k − 1), each with a
    bootstrap interval over questions."""
    d = np.asarray(mitigated, dtype=np.float64) - np.asarray(original, dtype=np.float64)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"paired scores must be non-empty (questions, positions), got shape {d.shape}")
    q, k = d.shape

    def stats(x: np.ndarray) -> np.ndarray:  # (r, q, k) -> (r, 2 + k): all, middle, per position
        per = x.mean(axis=1)
        middle = per[:, 1:k - 1].mean(axis=1) if k > 2 else np.full(len(x), np.nan)
        return np.column_stack([per.mean(axis=1), middle, per])

    point, ci = _bootstrap(stats, d, samples, seed, level)
    return {"questions": int(q), "effect": float(point[0]), "ci": ci(0),
            "middle": None if k <= 2 else {"effect": float(point[1]), "ci": ci(1)},
            "by_position": [{"position": p + 1, "effect": float(point[2 + p]), "ci": ci(2 + p)} for p in range(k)]}


def sentence(v: dict, metric: str) -> str:
    """The verdict in one sentence: last vs first position, paired, then the evidence word."""
    if v.get("effect") is None:
        return (f"Too few questions to tell: {v['questions']:,} (evidence of position bias: too few examples "
                "to tell).")
    e, k = v["effect"], v["k"]
    word = "lower" if e >= 0 else "higher"
    text = (f"With the gold document last (position {k}), answers score {V.minus_signed(abs(e))} {metric} {word} "
            f"than with it first ({v['questions']:,} questions, paired) [{V.ci_words(v['ci'], flip=e < 0)}]")
    if v["evidence"] == "too few":
        text += f"; fewer than {v['min_size']} questions"
    return f"{text}; evidence of position bias: {V.EVIDENCE_WORDS[v['evidence']]}."


def u_text(v: dict, metric: str) -> str:
    """"middle − best edge (first) −3.1 F1 [95% CI −4.0 to −2.2]: the middle is lost" or its absence."""
    u = v.get("u_shape")
    if not u:
        return "U-shape: – (needs 3 or more positions)"
    text = f"middle − best edge ({u['edge']}) {V.minus_signed(u['effect'])} {metric}"
    if u["ci"]:
        text += f" [{V.ci_words(u['ci'])}]"
        if u["ci"][1] < 0:
            text += ": lost in the middle"
        elif u["ci"][0] > 0:
            text += ": the middle scores higher than either edge"
        else:
            text += ": no U-shape shown"
    return text
