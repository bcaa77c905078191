"""Span heads. A head is any nn.Module with this protocol (`SpanHead`; no base class):

    forward(hidden (b, s, d), batch, targets=None) -> dict of score tensors, plus "loss" when
        `targets` (start_positions, end_positions) are given;
    span_scores(scores, max_answer_len) -> (b, L, s) band of span scores, [b, l, i] = score of span
        (i, i + l), L = min(max_answer_len, s) — decode takes its masked top-k (heads that build a
        full (b, s, s) matrix can return `span_scores.band_from_matrix(matrix, L)`);
    null_scores(scores, cls_index) -> (b,) score of the null answer (SQuAD v2);
    optionally top_spans(scores, start_ok, end_ok, max_answer_len, k), a faster exact equivalent of
        `span_scores.top_spans(span_scores(...), ...)` (the independent head's scores add up);
    optionally encode(encoder, encoder_inputs, batch) -> what forward receives as `hidden`, for heads
        that change the encoder's input (DyReF feeds its queries through the encoder), with
        `position_offset`, the positions they put before the tokens, and
        encoder_position_ids(encoder_inputs, batch) -> (b, position_offset + s) the position ids the
        encoder is given (what the position-update counter counts).

Heads register a factory `(hidden_size, null_answer, **head_options) -> head` in
`posbias.registry.HEADS`; importing this package registers the built-in ones. The factory's keyword
parameters are the head's options, checked by name and type (`posbias.factories`); posbias fills
in `hidden_size`, `null_answer` and, for a factory that names it, `embedding_size`, the width of
the encoder's input embeddings (narrower than `hidden_size` in ALBERT and ELECTRA-small); one with
`softmax_over` gets `model.softmax_over_default` when the run's head options do not set it. A head
registered with `debias=True` (`HEADS.register(name, debias=True)`) can take `train.debias`: its
scores are `start_logits` and `end_logits` over one candidate mask (`softmax_mask` of its
`softmax_over`, default context, and `null_answer`), which `posbias.qa.debias` re-weights.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from . import dynamic_query, independent, matrix, pointer  # noqa: F401


@runtime_checkable
class SpanHead(Protocol):
    """What every head has (`isinstance(head, SpanHead)` checks it). `null_answer` says whether
    `null_scores` is read. The optional methods below are looked up on the head where they are used
    (`hasattr`), as torch looks up a module's optional hooks: a head that lacks them gets the
    general behaviour (decode's masked top-k over `span_scores`; the model's own encoder call and
    position ids)."""

    null_answer: bool

    def forward(self, hidden, batch: dict, targets: dict | None = None) -> dict: ...

    def span_scores(self, scores: dict, max_answer_len: int): ...

    def null_scores(self, scores: dict, cls_index): ...


OPTIONAL_METHODS = ("top_spans", "encode", "encoder_position_ids")
"""The protocol's optional methods (the docstring above says what each does)."""
