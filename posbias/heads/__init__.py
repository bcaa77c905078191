"""Span heads. A head is any nn.Module with this protocol (no base class):

    forward(hidden (b, s, d), batch, targets=None) -> dict of score tensors, plus "loss" when
        `targets` (start_positions, end_positions) are given;
    span_scores(scores) -> (b, s, s) score of every span (i, j) — decode takes its band-masked top-k;
    null_scores(scores, cls_index) -> (b,) score of the null answer (SQuAD v2).

Heads register a factory `(hidden_size, null_answer, **head_options) -> head` in
`posbias.registry.HEADS`; importing this package registers the built-in ones.
"""
from . import independent  # noqa: F401
