"""The "vanilla" independent start/end head (Devlin et al., 2019; Random Padding paper Eq. 1-2).

Two vectors S, E score each token; a span's score is S·T_i + E·T_j. Its weights are one
Linear(d, 2) laid out like HF's `qa_outputs`, so `posbias export` can hand it to
AutoModelForQuestionAnswering.

`softmax_over` (the loss's normalisation; decoding is the same either way):
    context (default)  the context tokens only, plus [CLS] for SQuAD v2: Random Padding Eq. 1-2,
                       which sum over the context positions M_q+2 .. M_q+M_c+1
    all                every real token, [CLS] and question included, padding excluded: the DyReF
                       paper's vanilla (Eq. 1 over all N tokens; its authors ran HF's
                       AutoModelForQuestionAnswering, whose loss normalises over every position)

Shape legend: b batch, s sequence, d hidden.
"""
from __future__ import annotations

import torch
from torch import nn

from ...registry import HEADS
from .pointer import cross_entropy  # at least float32 (float64 stays float64)
from .span_scores import AdditiveSpans, check_softmax_over, masked_logits, softmax_mask


class IndependentHead(AdditiveSpans, nn.Module):
    def __init__(self, hidden_size: int, null_answer: bool = False, softmax_over: str = "context"):
        super().__init__()
        self.null_answer = null_answer
        self.softmax_over = check_softmax_over(softmax_over)
        self.qa_outputs = nn.Linear(hidden_size, 2)

    def forward(self, hidden: torch.Tensor, batch: dict, targets: dict | None = None) -> dict:
        logits = self.qa_outputs(hidden)  # (b, s, 2)
        start, end = logits.unbind(-1)  # (b, s) each
        mask = softmax_mask(batch, self.softmax_over, self.null_answer)  # (b, s)
        out = {"start_logits": masked_logits(start, mask), "end_logits": masked_logits(end, mask)}
        if targets is not None:
            # Eq. 1-2: cross-entropy of softmaxes restricted to `mask`.
            out["loss"] = (cross_entropy(out["start_logits"], targets["start_positions"])
                           + cross_entropy(out["end_logits"], targets["end_positions"])) / 2
        return out


@HEADS.register("independent", debias=True)
def independent(hidden_size: int, null_answer: bool = False, softmax_over: str = "context") -> IndependentHead:
    return IndependentHead(hidden_size, null_answer, softmax_over)
