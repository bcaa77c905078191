"""Pure helpers shared by every span head: candidate masks and the band-masked span top-k.

Shape legend: b batch, s sequence, k kept spans.
"""
from __future__ import annotations

import torch


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


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits with non-candidates at the dtype's minimum (finite, so all-masked rows stay NaN-free)."""
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


def top_spans(span_matrix: torch.Tensor, start_ok: torch.Tensor, end_ok: torch.Tensor,
              max_answer_len: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k spans (i, j) with start_ok[i], end_ok[j] and i <= j <= i + max_answer_len - 1.

    Args:
        span_matrix: (b, s, s) score of span (i, j).
        start_ok, end_ok: (b, s) bool, allowed start / end tokens.
    Returns:
        scores, starts, ends: (b, k'), k' = min(k, s*s), best first; rows with fewer valid spans
        than k' are filled with score -inf and start = end = -1.
    """
    if span_matrix.dim() != 3 or span_matrix.shape[1] != span_matrix.shape[2]:
        raise ValueError(f"span_matrix must be (b, s, s), got {tuple(span_matrix.shape)}")
    b, s, _ = span_matrix.shape
    if start_ok.shape != (b, s) or end_ok.shape != (b, s):
        raise ValueError(f"start_ok/end_ok must be {(b, s)}, got {tuple(start_ok.shape)}, {tuple(end_ok.shape)}")
    i = torch.arange(s, device=span_matrix.device)
    # band[i, j]: end not before start, answer at most max_answer_len tokens.
    band = (i[None, :] >= i[:, None]) & (i[None, :] <= i[:, None] + max_answer_len - 1)  # (s, s)
    valid = band[None] & start_ok[:, :, None] & end_ok[:, None, :]  # (b, s, s)
    flat = span_matrix.float().masked_fill(~valid, float("-inf")).reshape(b, s * s)  # (b, s*s)
    k = min(k, s * s)
    scores, idx = flat.topk(k, dim=1)  # (b, k)
    starts, ends = idx // s, idx % s
    bad = torch.isinf(scores)
    return scores, starts.masked_fill(bad, -1), ends.masked_fill(bad, -1)
