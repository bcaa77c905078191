"""Pure helpers shared by every span head: candidate and softmax masks and the band-masked span top-k.

Shape legend: b batch, s sequence, k kept spans.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from ...errors import ConfigError


def candidate_mask(span_mask: torch.Tensor, cls_index: torch.Tensor, with_null: bool) -> torch.Tensor:
    """(b, s) bool: positions a start/end softmax runs over — the context, plus [CLS] for SQuAD v2.

    Question and padding tokens are never candidates (Random Padding paper Eq. 1-2 sum over
    context tokens only), unlike HF BertForQuestionAnswering, which normalises over all tokens.
    """
    if not with_null:
        return span_mask
    mask = span_mask.clone()
    mask[torch.arange(mask.shape[0], device=mask.device), cls_index] = True
    return mask


SOFTMAX_OVER = ("context", "all")


def check_softmax_over(value: str) -> str:
    """`model.head_options.softmax_over`, checked (a ConfigError names the key)."""
    if value not in SOFTMAX_OVER:
        raise ConfigError(f"model.head_options.softmax_over must be one of {list(SOFTMAX_OVER)}, got {value!r}")
    return value


def softmax_mask(batch: dict, softmax_over: str, with_null: bool) -> torch.Tensor:
    """(b, s) bool: the tokens a start/end softmax normalises over.

    `context`: the candidates (`candidate_mask`; Random Padding paper Eq. 1-2). `all`: every real
    token, [CLS] and question included, padding excluded (DyReF Eq. 1 sums over all N input tokens;
    the authors' dyref.py masks only padding; HF BertForQuestionAnswering's loss). Only the loss
    differs: decoding restricts spans to the context itself (`decode.batch_candidates`), and the
    SQuAD v2 null score reads the [CLS] logits, which are real under both.
    """
    if softmax_over == "all":
        return batch["attention_mask"].bool()
    return candidate_mask(batch["span_mask"], batch["cls_index"], with_null)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits with non-candidates at the dtype's minimum (finite, so all-masked rows stay NaN-free)."""
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


def band(x: torch.Tensor, width: int, fill) -> torch.Tensor:
    """(b, s) -> (b, L, s) with out[b, l, i] = x[b, i + l] (`fill` past the end), L = width.

    The span "matrix" of a head only matters on its band j - i < max_answer_len, so heads score
    (b, L, s) bands instead of (b, s, s) matrices: s/L times less work (384/30 = 13x). The offset l
    is the outer axis so that reductions over it are elementwise over contiguous rows of s.
    """
    b, s = x.shape
    padded = torch.cat([x, x.new_full((b, width - 1), fill)], dim=1)  # (b, s + L - 1)
    # A contiguous copy: a view has two unit strides, and ops on it may lay out their results as
    # (b, s, L), which makes the reductions over L several times slower.
    return padded.unfold(1, s, 1).contiguous()  # (b, L, s)


def band_from_matrix(matrix: torch.Tensor, width: int) -> torch.Tensor:
    """(b, s, s) span matrix -> (b, L, s) band, out[b, l, i] = matrix[b, i, i + l] (-inf past the end)."""
    b, s, _ = matrix.shape
    j = torch.arange(width, device=matrix.device)[:, None] + torch.arange(s, device=matrix.device)  # (L, s)
    rows = torch.arange(s, device=matrix.device).expand(width, s)  # (L, s): start i
    out = matrix[:, rows, j.clamp(max=s - 1)]  # (b, L, s)
    return out.masked_fill(j >= s, float("-inf"))


def top_spans(span_band: torch.Tensor, start_ok: torch.Tensor, end_ok: torch.Tensor,
              k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k spans (i, j = i + l) of a band of span scores, with start_ok[i] and end_ok[j].

    Args:
        span_band: (b, L, s) score of span (i, i + l); L = max_answer_len bounds the answer length
            and l >= 0 keeps end >= start.
        start_ok, end_ok: (b, s) bool, allowed start / end tokens.
    Returns:
        scores, starts, ends: (b, k'), k' = min(k, min(k, s)*L), best first; rows with fewer valid
        spans than k' are filled with score -inf and start = end = -1.
    """
    if span_band.dim() != 3:
        raise ValueError(f"span_band must be (b, L, s), got {tuple(span_band.shape)}")
    b, width, s = span_band.shape
    if start_ok.shape != (b, s) or end_ok.shape != (b, s):
        raise ValueError(f"start_ok/end_ok must be {(b, s)}, got {tuple(start_ok.shape)}, {tuple(end_ok.shape)}")
    neg = float("-inf")
    zero = span_band.new_zeros((), dtype=torch.float32)
    end_pen = band(torch.where(end_ok, zero, neg), width, neg)  # (b, L, s); -inf past the end
    masked = span_band.float() + end_pen  # (b, L, s), -inf where the end is not allowed
    # Exact two-stage top-k: the k best spans all start at one of the k starts with the best
    # row maxima (any other start's best span is beaten by k spans of those starts), so only
    # k starts x L scores enter the final top-k instead of all s x L.
    row_best = masked.amax(dim=1).masked_fill(~start_ok, neg)  # (b, s)
    kr = min(k, s)
    rows = row_best.topk(kr, dim=1).indices  # (b, kr)
    cand = masked.gather(2, rows[:, None, :].expand(b, width, kr))  # (b, L, kr)
    cand = cand + torch.where(start_ok.gather(1, rows), zero, neg)[:, None, :]  # rows picked only as filler
    k = min(k, kr * width)
    scores, idx = cand.reshape(b, width * kr).topk(k, dim=1)  # (b, k)
    starts = rows.gather(1, idx % kr)
    ends = starts + idx // kr
    bad = torch.isinf(scores)
    return scores, starts.masked_fill(bad, -1), ends.masked_fill(bad, -1)


def top_spans_additive(start: torch.Tensor, end: torch.Tensor, start_ok: torch.Tensor, end_ok: torch.Tensor,
                       max_answer_len: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`top_spans` for scores that add up, score(i, j) = start[i] + end[j], without the band.

    The same two stages in O(b*s + b*k*L): a sliding-window max of the end scores gives each
    start's best span, the k best starts are expanded to their L ends, and the top-k taken there.
    Equal to `top_spans(band(start + end), ...)` (up to ties).
    """
    b, s = start.shape
    width = min(max_answer_len, s)
    neg = float("-inf")
    st = start.float().masked_fill(~start_ok, neg)  # (b, s)
    en = end.float().masked_fill(~end_ok, neg)
    en = torch.cat([en, en.new_full((b, width - 1), neg)], dim=1)  # (b, s + L - 1)
    best_end = F.max_pool1d(en[:, None, :], width, stride=1)[:, 0]  # (b, s): max of en[i .. i+L-1]
    kr = min(k, s)
    rows = (st + best_end).topk(kr, dim=1).indices  # (b, kr)
    j = rows[:, None, :] + torch.arange(width, device=start.device)[None, :, None]  # (b, L, kr)
    cand = st.gather(1, rows)[:, None, :] + en.gather(1, j.reshape(b, -1)).reshape(b, width, kr)
    scores, idx = cand.reshape(b, width * kr).topk(min(k, width * kr), dim=1)  # (b, k)
    starts = rows.gather(1, idx % kr)
    ends = starts + idx // kr
    bad = torch.isinf(scores)
    return scores, starts.masked_fill(bad, -1), ends.masked_fill(bad, -1)


class AdditiveSpans:
    """Span scoring for heads whose span score adds up, score(i, j) = start[i] + end[j], read from
    `scores["start_logits"]` and `scores["end_logits"]` (b, s): the protocol's span_scores,
    top_spans (the fast exact path) and null_scores."""

    def span_scores(self, scores: dict, max_answer_len: int) -> torch.Tensor:
        """(b, L, s) band: [b, l, i] = start[i] + end[i + l], L = min(max_answer_len, s)."""
        width = min(max_answer_len, scores["end_logits"].shape[1])
        end = band(scores["end_logits"], width, torch.finfo(scores["end_logits"].dtype).min)  # (b, L, s)
        return scores["start_logits"][:, None, :] + end

    def top_spans(self, scores: dict, start_ok, end_ok, max_answer_len: int, k: int):
        """Fast path of decoding: span scores add up, so no (b, L, s) band is built."""
        return top_spans_additive(scores["start_logits"], scores["end_logits"], start_ok, end_ok,
                                  max_answer_len, k)

    def null_scores(self, scores: dict, cls_index: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(cls_index.shape[0], device=cls_index.device)
        return scores["start_logits"][rows, cls_index] + scores["end_logits"][rows, cls_index]  # (b,)
