"""Scores + windows -> answers: per-window top spans, merged per question, n-best, v2 null answers.

Shape legend: n windows, k spans kept per window, b batch, s sequence.
Everything is vectorised (torch top-k over the band-masked span matrix, numpy group-by for the
merge); the only Python loop runs over the kept n-best answers to cut their text.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .data.examples import QAExample
from .data.features import QAFeatures
from .heads.span_scores import top_spans


@dataclass
class WindowCandidates:
    """Top spans of every window, in unpadded window coordinates.

    scores, starts, ends: (n, k); start = end = -1 marks "no valid span". null: (n,) null-answer
    score (SQuAD v2), NaN when the head has none.
    """

    scores: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    null: np.ndarray

    @classmethod
    def empty(cls, n: int, k: int) -> "WindowCandidates":
        return cls(np.full((n, k), -np.inf, np.float32), np.full((n, k), -1, np.int64),
                   np.full((n, k), -1, np.int64), np.full(n, np.nan, np.float32))

    def fill(self, rows: np.ndarray, scores, starts, ends, null) -> None:
        k = scores.shape[1]
        self.scores[rows, :k], self.starts[rows, :k], self.ends[rows, :k] = scores, starts, ends
        self.null[rows] = null


def batch_candidates(head, scores: dict, batch: dict, *, k: int, max_answer_len: int,
                     require_max_context: bool = False) -> tuple[np.ndarray, ...]:
    """Top-k spans of a batch: (scores (b, k), starts (b, k), ends (b, k), null (b,)) as numpy.

    Start and end must be context tokens (question, special and padding tokens are never answers);
    with `require_max_context` a window only proposes starts it holds in maximal context.
    """
    start_ok = batch["span_mask"]
    if require_max_context:
        start_ok = start_ok & batch["max_context"]
    sc, st, en = top_spans(head.span_scores(scores), start_ok, batch["span_mask"], max_answer_len, k)
    pad = batch["pad_left"][:, None]
    # Back to unpadded window coordinates (left padding shifted every token right).
    st = torch.where(st >= 0, st - pad, st)
    en = torch.where(en >= 0, en - pad, en)
    if getattr(head, "null_answer", False):
        null = head.null_scores(scores, batch["cls_index"]).float()
    else:
        null = torch.full((sc.shape[0],), float("nan"))
    return sc.cpu().numpy(), st.cpu().numpy(), en.cpu().numpy(), null.cpu().numpy()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def decode(examples: list[QAExample], features: QAFeatures, cands: WindowCandidates, *,
           n_best: int = 20, version: int = 1, null_threshold: float = 0.0):
    """Merge window candidates into answers.

    Returns:
        predictions: id -> answer text ("" = no answer, v2).
        nbest: id -> list of {text, probability, score, start_char, end_char, window, token_start,
            token_end}, best first; probabilities are a softmax over the listed scores.
        null_odds: id -> null score - best span score (v2 only, else empty).
    """
    n, k = cands.scores.shape
    ex = np.repeat(features.example_index, k)  # (n*k,)
    win = np.repeat(np.arange(n), k)
    sc, st, en = cands.scores.reshape(-1), cands.starts.reshape(-1), cands.ends.reshape(-1)
    keep = st >= 0  # windows with fewer than k valid spans padded their rows with -1
    ex, win, sc, st, en = ex[keep], win[keep], sc[keep], st[keep], en[keep]
    # Group by example, best score first; rank inside the group keeps the top n_best.
    order = np.lexsort((-sc, ex))
    ex, win, sc, st, en = ex[order], win[order], sc[order], st[order], en[order]
    group_start = np.r_[0, np.flatnonzero(ex[1:] != ex[:-1]) + 1]
    rank = np.arange(len(ex)) - np.repeat(group_start, np.diff(np.r_[group_start, len(ex)]))
    top = rank < n_best
    ex, win, sc, st, en = ex[top], win[top], sc[top], st[top], en[top]

    null = None
    if version == 2:
        # The null score of a question is its lowest window [CLS] score (BERT / HF convention).
        null = np.full(len(examples), np.inf)
        np.minimum.at(null, features.example_index, cands.null.astype(np.float64))

    spans: dict[int, list] = {}
    for e, w, s, a, b in zip(ex.tolist(), win.tolist(), sc.tolist(), st.tolist(), en.tolist()):
        o = features.offsets[w]
        c0, c1 = int(o[a, 0]), int(o[b, 1])
        spans.setdefault(e, []).append({"text": examples[e].context[c0:c1], "score": s, "start_char": c0,
                                        "end_char": c1, "window": w, "token_start": a, "token_end": b})
    predictions, nbest, null_odds = {}, {}, {}
    for i, example in enumerate(examples):
        cand = spans.get(i, [])
        best_span = cand[0] if cand else None
        if version == 2 and np.isfinite(null[i]):
            entry = {"text": "", "score": float(null[i]), "start_char": -1, "end_char": -1,
                     "window": -1, "token_start": -1, "token_end": -1}
            cand = sorted(cand + [entry], key=lambda c: -c["score"])[:n_best]
        if cand:
            probs = _softmax(np.array([c["score"] for c in cand], dtype=np.float64))
            cand = [dict(c, probability=float(p)) for c, p in zip(cand, probs)]
        nbest[example.id] = cand
        if version == 2:
            # No span at all: as sure of "no answer" as JSON can say (Infinity is not valid JSON).
            diff = float(null[i]) - best_span["score"] if best_span else 1e9
            null_odds[example.id] = diff
            predictions[example.id] = "" if best_span is None or diff > null_threshold else best_span["text"]
        else:
            predictions[example.id] = best_span["text"] if best_span else ""
    return predictions, nbest, null_odds
