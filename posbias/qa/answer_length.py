"""EM/F1 by gold answer length (the MaP paper's Fig. 6: scores per answer-length bucket).

A question's length is the number of words (whitespace tokens of the raw text) of its *shortest*
gold answer text. SQuAD dev questions carry several annotators' answers that mostly differ by extra
words around a shared core ("1990s" / "the 1990s" / "in the 1990s"); since EM/F1 take the max over
gold texts, the shortest is the core a prediction is credited for, and unlike "the first" it does not
depend on the order the annotations were stored in. Questions with no gold text (SQuAD v2
unanswerable) get the label "no answer".
"""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError, did_you_mean
from ..registry import SEGMENTERS
from .examples import QAExample

DEFAULT_EDGES = (1, 2, 3, 4, 6, 11)
NO_ANSWER = "no answer"


def check_edges(edges, key: str = "edges") -> tuple[int, ...]:
    """Validate bucket lower edges: strictly increasing integers starting at 1 (every answer has at
    least one word, so every answer falls in a bucket)."""
    ok = (isinstance(edges, (list, tuple)) and edges and edges[0] == 1
          and all(isinstance(e, int) and not isinstance(e, bool) for e in edges)
          and all(a < b for a, b in zip(edges, edges[1:])))
    if not ok:
        raise ConfigError(f"{key} must be a strictly increasing list of integers starting at 1, got {edges!r}")
    return tuple(edges)


def bucket_label(n_words: int, edges=DEFAULT_EDGES) -> str:
    """Label of the bucket [edges[i], edges[i+1]) holding `n_words` ("04-05"), or "11+" for the last.

    Numbers are zero-padded to the widest edge so the labels sort in length order as plain strings
    (the report and `posbias diagnose qa` sort segments that way); "no answer" sorts after them.
    """
    w = len(str(edges[-1]))
    i = max(j for j, e in enumerate(edges) if e <= n_words)
    lo = edges[i]
    if i == len(edges) - 1:
        return f"{lo:0{w}d}+"
    hi = edges[i + 1] - 1
    return f"{lo:0{w}d}" if hi == lo else f"{lo:0{w}d}-{hi:0{w}d}"


def length_label(gold_texts: list[str], edges=DEFAULT_EDGES) -> str:
    """Bucket of the shortest gold text in words; "no answer" when no gold text has a word."""
    lengths = [len(t.split()) for t in gold_texts if t.split()]
    return bucket_label(min(lengths), edges) if lengths else NO_ANSWER


def answer_length_labels(examples: list[QAExample], edges=DEFAULT_EDGES) -> dict[str, str]:
    """Question id -> answer-length bucket, from the texts the metric scores against."""
    return {e.id: length_label(e.gold_texts(), edges) for e in examples}


def breakdown(labels: Mapping[str, str], scores: Mapping[str, tuple[float, float]], em_key: str = "exact") -> dict:
    """Bucket -> {"total", em_key, "f1"} (percentages), from per-question (EM, F1) in 0..1.

    Args:
        labels: question id -> bucket; questions without a label are left out.
        scores: question id -> (exact, f1), e.g. `metrics.per_question`.
        em_key: "exact_match" (v1.1) or "exact" (v2.0), the name of EM in the overall result.

    Returns:
        Only non-empty buckets, in label order; count-weighted, their means give the overall ones.
    """
    groups: dict[str, list[tuple[float, float]]] = {}
    for qid, s in scores.items():
        if qid in labels:
            groups.setdefault(labels[qid], []).append(s)
    return {label: {"total": len(g), em_key: 100.0 * sum(em for em, _ in g) / len(g),
                    "f1": 100.0 * sum(f for _, f in g) / len(g)}
            for label, g in sorted(groups.items())}


@SEGMENTERS.register("answer_length")
def answer_length(examples, eval_dir, checkpoint, edges=DEFAULT_EDGES, **options):
    """Length bucket of the shortest gold answer, in words (MaP Fig. 6); option `edges`: the
    buckets' lower bounds, default [1, 2, 3, 4, 6, 11] -> 01, 02, 03, 04-05, 06-10, 11+."""
    return answer_length_labels(examples, check_edges(edges))


def _check_options(options: dict, key: str) -> None:
    """Called by the experiment spec loader: errors name `segments[i].<option>`."""
    for k in options:
        if k != "edges":
            raise ConfigError(f"{key}.{k}: unknown option of answer_length"
                              + (did_you_mean(k, ["edges"], prefix=f"{key}.") or " (it takes edges)"))
    check_edges(options.get("edges", DEFAULT_EDGES), f"{key}.edges")


answer_length.gold_only = True  # depends on the gold answers only: the same questions for every method
answer_length.needs_checkpoint = False  # text alone: an archive without checkpoints still gets its bootstrap
answer_length.check_options = _check_options
