"""Scores + windows -> answers: per-window top spans, merged per question, n-best, v2 null answers.

Shape legend: n windows, k spans kept per window, b batch, s sequence.
Everything is vectorised (torch top-k over the band of span scores, numpy group-by for the
merge); the only Python loop runs over the kept n-best answers to cut their text.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .examples import QAExample
from .features import QAFeatures
from .heads.span_scores import top_spans


@dataclass
class WindowCandidates:
    """Top spans of every window, in unpadded window coordinates.

    scores, starts, ends: (n, k); start = end = -1 marks "no valid span". null: (n,) null-answer
    score (SQuAD v2), NaN when the head has none. start_chars, end_chars: (n, k) the spans'
    character span in the context, read from the window's offsets while it is in memory (so
    decoding needs no window afterwards), or None when some fill did not give them.
    """

    scores: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    null: np.ndarray
    start_chars: np.ndarray | None = None
    end_chars: np.ndarray | None = None

    @classmethod
    def empty(cls, n: int, k: int) -> "WindowCandidates":
        return cls(np.full((n, k), -np.inf, np.float32), np.full((n, k), -1, np.int64),
                   np.full((n, k), -1, np.int64), np.full(n, np.nan, np.float32),
                   np.full((n, k), -1, np.int64), np.full((n, k), -1, np.int64))

    def fill(self, rows: np.ndarray, scores, starts, ends, null, start_chars=None, end_chars=None) -> None:
        k = scores.shape[1]
        self.scores[rows, :k], self.starts[rows, :k], self.ends[rows, :k] = scores, starts, ends
        self.null[rows] = null
        if start_chars is None or self.start_chars is None:
            self.start_chars = self.end_chars = None  # decode reads them from the features' offsets
        else:
            self.start_chars[rows, :k], self.end_chars[rows, :k] = start_chars, end_chars


def candidate_chars(features: QAFeatures, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start_chars, end_chars), shaped like starts/ends (n, k): character span of each token span of
    windows 0..n-1 of `features` (-1 where start is -1)."""
    base = np.r_[0, np.cumsum(features.lengths)[:-1]]  # (n,) first token of each window in `flat`
    flat = np.concatenate(features.offsets)  # (sum L_i, 2)
    ok = starts >= 0
    rows = np.broadcast_to(base[:, None], starts.shape)
    c0, c1 = np.full(starts.shape, -1, np.int64), np.full(starts.shape, -1, np.int64)
    c0[ok], c1[ok] = flat[rows[ok] + starts[ok], 0], flat[rows[ok] + ends[ok], 1]
    return c0, c1


def batch_candidates(head, scores: dict, batch: dict, *, k: int, max_answer_len: int,
                     require_max_context: bool = False) -> tuple[np.ndarray, ...]:
    """Top-k spans of a batch: (scores (b, k), starts (b, k), ends (b, k), null (b,)) as numpy.

    Start and end must be context tokens (question, special and padding tokens are never answers);
    with `require_max_context` a window only proposes starts it holds in maximal context.
    """
    start_ok = batch["span_mask"]
    if require_max_context:
        start_ok = start_ok & batch["max_context"]
    if hasattr(head, "top_spans"):
        sc, st, en = head.top_spans(scores, start_ok, batch["span_mask"], max_answer_len, k)
    else:
        sc, st, en = top_spans(head.span_scores(scores, max_answer_len), start_ok, batch["span_mask"], k)
    pad = batch["pad_left"][:, None]
    # Back to unpadded window coordinates (left padding shifted every token right).
    st = torch.where(st >= 0, st - pad, st)
    en = torch.where(en >= 0, en - pad, en)
    if getattr(head, "null_answer", False):
        null = head.null_scores(scores, batch["cls_index"]).float()
    else:
        null = torch.full((sc.shape[0],), float("nan"))
    return sc.cpu().numpy(), st.cpu().numpy(), en.cpu().numpy(), null.cpu().numpy()


def _top_per_group(key: np.ndarray, score: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Order rows by (key, score descending) and keep the n best of each key.

    Returns (row indices in that order, start offset of each kept group in the result)."""
    order = np.lexsort((-score, key))
    k = key[order]
    starts = np.r_[0, np.flatnonzero(k[1:] != k[:-1]) + 1] if len(k) else np.zeros(0, np.int64)
    rank = np.arange(len(k)) - np.repeat(starts, np.diff(np.r_[starts, len(k)]))
    kept = order[rank < n]
    kk = key[kept]
    group = np.r_[0, np.flatnonzero(kk[1:] != kk[:-1]) + 1] if len(kk) else np.zeros(0, np.int64)
    return kept, group


def decode(examples: list[QAExample], features: QAFeatures, cands: WindowCandidates, *,
           n_best: int = 20, version: int = 1, null_threshold: float = 0.0):
    """Merge window candidates into answers.

    Args:
        features: the windows' `example_index` (QAFeatures or StreamedFeatures); their offsets are
            read only when `cands` lacks character spans.
    Returns:
        predictions: id -> answer text ("" = no answer, v2).
        nbest: id -> list of {text, probability, score, start_char, end_char, window, token_start,
            token_end}, best first; probabilities are a softmax over the listed scores (the null
            answer, text "", competes in the list for v2, as in the HF examples).
        null_odds: id -> null score - best span score (v2 only, else empty).
    """
    n, k = cands.scores.shape
    ex = np.repeat(features.example_index, k)  # (n*k,)
    win = np.repeat(np.arange(n), k)
    sc = cands.scores.reshape(-1).astype(np.float64)
    st, en = cands.starts.reshape(-1), cands.ends.reshape(-1)
    keep = st >= 0  # windows with fewer than k valid spans padded their rows with -1
    ex, win, sc, st, en = ex[keep], win[keep], sc[keep], st[keep], en[keep]
    kept, group = _top_per_group(ex, sc, n_best)
    if cands.start_chars is None:
        c0, c1 = candidate_chars(features, cands.starts, cands.ends)
    else:
        c0, c1 = cands.start_chars, cands.end_chars
    c0, c1 = c0.reshape(-1)[keep], c1.reshape(-1)[keep]
    ex, win, sc, st, en, c0, c1 = ex[kept], win[kept], sc[kept], st[kept], en[kept], c0[kept], c1[kept]
    contexts = [e.context for e in examples]
    # Each question's best span: the first of its group (spans are sorted best first).
    best_score = np.full(len(examples), -np.inf)
    best_score[ex[group]] = sc[group]
    best_text = [""] * len(examples)
    for e, a, b in zip(ex[group].tolist(), c0[group].tolist(), c1[group].tolist()):
        best_text[e] = contexts[e][a:b]

    null = None
    if version == 2:
        # The null score of a question is its lowest window [CLS] score (BERT / HF convention).
        null = np.full(len(examples), np.inf)
        np.minimum.at(null, features.example_index, cands.null.astype(np.float64))
        has = np.flatnonzero(np.isfinite(null))
        none = np.full(len(has), -1)
        ex, win, sc = np.r_[ex, has], np.r_[win, none], np.r_[sc, null[has]]
        st, en, c0, c1 = np.r_[st, none], np.r_[en, none], np.r_[c0, none], np.r_[c1, none]
        kept, group = _top_per_group(ex, sc, n_best)
        ex, win, sc, st, en, c0, c1 = ex[kept], win[kept], sc[kept], st[kept], en[kept], c0[kept], c1[kept]

    # Softmax over each question's list (its first score is its maximum).
    sizes = np.diff(np.r_[group, len(ex)])
    z = np.exp(sc - np.repeat(sc[group], sizes))
    prob = z / np.repeat(np.add.reduceat(z, group), sizes) if len(z) else z
    # One pass builds the n-best entries and cuts their texts (the null answer, start -1, is "").
    rows = [{"text": contexts[e][a:b] if i >= 0 else "", "probability": p, "score": s, "start_char": a,
             "end_char": b, "window": w, "token_start": i, "token_end": j}
            for e, p, s, a, b, w, i, j in zip(ex.tolist(), prob.tolist(), sc.tolist(), c0.tolist(), c1.tolist(),
                                               win.tolist(), st.tolist(), en.tolist())]
    lists = {int(ex[g]): rows[g:g + m] for g, m in zip(group.tolist(), sizes.tolist())}

    predictions, nbest, null_odds = {}, {}, {}
    has_span = np.isfinite(best_score).tolist()
    if version == 2:
        # No span at all: as sure of "no answer" as JSON can say (Infinity is not valid JSON).
        odds = np.where(has_span, null - best_score, 1e9).tolist()
    for i, example in enumerate(examples):
        nbest[example.id] = lists.get(i, [])
        if version == 2:
            null_odds[example.id] = odds[i]
            predictions[example.id] = best_text[i] if has_span[i] and odds[i] <= null_threshold else ""
        else:
            predictions[example.id] = best_text[i]
    return predictions, nbest, null_odds
