"""The "vanilla" independent start/end head (Devlin et al., 2019; Random Padding paper Eq. 1-2).

Two vectors S, E score each token; P(start = i) is a softmax over context tokens only (and [CLS]
for SQuAD v2); a span's score is S·T_i + E·T_j. Its weights are one Linear(d, 2) laid out like
HF's `qa_outputs`, so `posbias export` can hand it to AutoModelForQuestionAnswering.

Shape legend: b batch, s sequence, d hidden.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import ConfigError
from ...registry import HEADS
from .span_scores import AdditiveSpans, candidate_mask, masked_logits


class IndependentHead(AdditiveSpans, nn.Module):
    def __init__(self, hidden_size: int, null_answer: bool = False, softmax_over: str = "context"):
        super().__init__()
        if softmax_over not in ("context", "all"):
            raise ConfigError(f"model.head_options.softmax_over must be 'context' or 'all', got {softmax_over!r}")
        self.null_answer = null_answer
        self.softmax_over = softmax_over
        self.qa_outputs = nn.Linear(hidden_size, 2)

    def forward(self, hidden: torch.Tensor, batch: dict, targets: dict | None = None) -> dict:
        logits = self.qa_outputs(hidden)  # (b, s, 2)
        start, end = logits.unbind(-1)  # (b, s) each
        if self.softmax_over == "all":
            # HF BertForQuestionAnswering's loss: every real token (question too) competes. Kept as
            # an option to measure what the context-only softmax (Eq. 1-2) buys; decoding is the same.
            mask = batch["attention_mask"].bool()
        else:
            mask = candidate_mask(batch["span_mask"], batch["cls_index"], self.null_answer)
        out = {"start_logits": masked_logits(start, mask), "end_logits": masked_logits(end, mask)}
        if targets is not None:
            # Eq. 1-2: cross-entropy of softmaxes restricted to the candidates.
            out["loss"] = (F.cross_entropy(out["start_logits"].float(), targets["start_positions"])
                           + F.cross_entropy(out["end_logits"].float(), targets["end_positions"])) / 2
        return out


@HEADS.register("independent")
def independent(hidden_size: int, null_answer: bool = False, softmax_over: str = "context") -> IndependentHead:
    return IndependentHead(hidden_size, null_answer, softmax_over)
