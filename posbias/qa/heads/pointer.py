"""The vector-based conditional pointer head (VCP) of the MaP paper (§2.2, Eq. 2-6), and the
additive-attention pieces it shares with the matrix head (`matrix.py`).

    p_init = softmax(v_Qᵀ tanh(V_Q H_Qᵀ))            Eq. 5  (over question tokens)
    h_s    = H_Qᵀ p_init                              Eq. 6
    p_s    = softmax(vᵀ tanh(V Hᵀ + [W h_s]ⁿ))        Eq. 4 with h_s ("p(s|H) is similar")
    c_e    = Hᵀ p_s                                   Eq. 3
    h_e    = RNN(h_s, c_e)                            Eq. 2  (one GRU step: input c_e, state h_s)
    p_e    = softmax(vᵀ tanh(V Hᵀ + [W h_e]ⁿ))        Eq. 4

The two pointer steps share V, v and W, as the answer pointer of Wang & Jiang (2017) and R-NET do
(the paper's Eq. 4 writes one set). Softmaxes run over the context (plus [CLS] for SQuAD v2), like
every posbias head. Scores are log-probabilities, so a span's score log p_s(i) + log p_e(j) adds up
and decoding takes the independent head's fast path.

Shape legend: b batch, s sequence, d hidden, l additive-attention width.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import ConfigError
from ...registry import HEADS
from .span_scores import AdditiveSpans, candidate_mask, masked_logits


def reads_wait(t: torch.Tensor) -> bool:
    """Whether reading `t`'s values on the host (`nonzero`, `int(t)`) waits for a device: for any
    tensor not on the CPU. A forward then keeps to shapes that need no such read, so that the GPU
    never waits on Python; on a CPU it may use them to skip work."""
    return t.device.type != "cpu"


def check_width(width, hidden_size: int) -> int:
    """The additive-attention width l (`model.head_options.width`); default: the hidden size."""
    if width is None:
        return hidden_size
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ConfigError(f"model.head_options.width must be a positive integer, got {width!r}")
    return width


class QuestionPooling(nn.Module):
    """Eq. 5-6: an attention-weighted sum of the question tokens' states, h_s (b, d)."""

    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, width, bias=False)  # V_Q
        self.v = nn.Linear(width, 1, bias=False)  # v_Q

    def forward(self, hidden: torch.Tensor, question_mask: torch.Tensor) -> torch.Tensor:
        # On a CPU only the columns from the batch's first to its last question token are scored:
        # the others are masked anyway, and the question is a small part of a window. On a GPU the
        # bounds would be a host read per forward (`reads_wait`): every column is scored and masked.
        if not reads_wait(question_mask):
            cols = question_mask.any(0).nonzero()
            if len(cols):
                lo, hi = int(cols[0]), int(cols[-1]) + 1
                hidden, question_mask = hidden[:, lo:hi], question_mask[:, lo:hi]
        logits = self.v(torch.tanh(self.proj(hidden))).squeeze(-1)  # (b, q)
        p_init = masked_logits(logits, question_mask).softmax(-1)  # (b, q)
        return torch.einsum("bs,bsd->bd", p_init, hidden)


class AdditivePointer(nn.Module):
    """Eq. 4: logits_j = vᵀ tanh(V H_j + W h) for one state h per row, (b, s)."""

    def __init__(self, hidden_size: int, width: int, state_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, width, bias=False)  # V
        self.state = nn.Linear(state_size, width, bias=False)  # W
        self.v = nn.Linear(width, 1, bias=False)  # v

    def forward(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.score(self.proj(hidden), state)

    def score(self, projected: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Eq. 4 from V H (b, s, l) computed once: VCP's two pointer steps share it."""
        return self.v(torch.tanh(projected + self.state(state)[:, None, :])).squeeze(-1)


def question_mask(batch: dict) -> torch.Tensor:
    """(b, s) bool question tokens; batches without the key fall back to real non-context tokens."""
    if "question_mask" in batch:
        return batch["question_mask"]
    return batch["attention_mask"].bool() & ~batch["span_mask"]


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least float32 for softmaxes and losses (half precision in, float32 out; float64 stays)."""
    return x if x.dtype == torch.float64 else x.float()


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(upcast(logits), target)


class ConditionalPointerHead(AdditiveSpans, nn.Module):
    """VCP (Eq. 2-6): the start pointer conditions the end pointer through c_e and one GRU step."""

    def __init__(self, hidden_size: int, null_answer: bool = False, width: int | None = None):
        super().__init__()
        width = check_width(width, hidden_size)
        self.null_answer = null_answer
        self.pool = QuestionPooling(hidden_size, width)
        self.pointer = AdditivePointer(hidden_size, width, hidden_size)
        self.rnn = nn.GRUCell(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor, batch: dict, targets: dict | None = None) -> dict:
        mask = candidate_mask(batch["span_mask"], batch["cls_index"], self.null_answer)  # (b, s)
        h_s = self.pool(hidden, question_mask(batch))  # (b, d)  Eq. 5-6
        vh = self.pointer.proj(hidden)  # (b, s, l): V H, shared by both steps
        start = masked_logits(self.pointer.score(vh, h_s), mask)  # (b, s)  Eq. 4 with h_s
        p_s = upcast(start).softmax(-1).to(hidden.dtype)  # (b, s)
        c_e = torch.einsum("bs,bsd->bd", p_s, hidden)  # Eq. 3
        h_e = self.rnn(c_e, h_s)  # Eq. 2
        end = masked_logits(self.pointer.score(vh, h_e), mask)  # Eq. 4
        out = {"start_logits": upcast(start).log_softmax(-1), "end_logits": upcast(end).log_softmax(-1)}
        if targets is not None:
            out["loss"] = (cross_entropy(start, targets["start_positions"])
                           + cross_entropy(end, targets["end_positions"])) / 2
        return out


@HEADS.register("conditional_pointer", debias=True)
def conditional_pointer(hidden_size: int, null_answer: bool = False, width: int | None = None):
    return ConditionalPointerHead(hidden_size, null_answer, width)
