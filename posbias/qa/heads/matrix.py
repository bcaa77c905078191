"""MaP, the matrix-based conditional span head (Luo et al., "MaP: A Matrix-based Prediction
Approach to Improve Span Extraction in Machine Reading Comprehension"), §2.3-2.6.

One *direction* (forward = start first, MaP_F; backward = end first) is:
    p_first = softmax(vᵀ tanh(V Hᵀ + [W h_s]ⁿ)), h_s pooled from the question   Eq. 4-6 (Alg. 1 l. 6)
    P_second(i, ·) = softmax_j(vᵀ tanh(V [H_j ; H_i]))                         Eq. 7, one row per i
and a span's probability is p_first(i) · P_second(i, j) (§2.6). V [H_j ; H_i] = V₁H_j + V₂H_i, so a
matrix entry is vᵀ tanh(A_j + B_i) with A = V₁H (b, s, l) and B_i = V₂H_i projected only for the rows
in use (sampled or top-k rows, not all s): the (b, s, s, 2d) concatenation is never built, and rows
are computed in chunks of bounded size.

Options (`model.head_options`):
- `direction` (§2.6): `forward`, `backward`, or `both` — ONE model with both directions on the
  shared encoder, trained with the two directions' losses averaged. Chosen over two separately
  trained models because it costs one encoder pass and one checkpoint, and the same checkpoint
  decodes as MaP_F (`ensemble: false`) or MaP_E (`ensemble: true`, the default for `both`).
- `ensemble` (§2.6, MaP_E): top-k pairs F of the forward direction, top-k pairs B of the backward
  one, pairs of B already in F pruned (F's probability is kept), the best probability wins.
- `training` (§2.4-2.5): `sampled` (Eq. 8-12) — the top k-1 first positions other than the gold one
  plus the gold one; for each such row the top k-1 second positions other than the gold one plus
  the gold one. `exact`: every candidate, for short inputs and tests.
  Loss: ½(L_first + L_second) (Eq. 10), averaged over directions for `both`.
- `normalization` (Eq. 12): what L_second normalises over. The paper's text admits two readings:
  - `row` (default; Eq. 12 as written): P̂ is "a part of the original P_e", i.e. Eq. 7's row-wise
    probabilities, and the one-hot target picks L_second = -log P̂(ŝ, ê). Only the gold row
    carries a loss term, so only it is computed; `sampled` normalises that row over its k sampled
    columns (Fig. 5: unsampled entries keep their values), `exact` over the whole context. Training
    and inference (Eq. 7, a softmax per row) then use the same normalisation.
  - `block`: ONE softmax over the flattened k x k block (𝒯 read as flattening logits), so the other
    sampled rows are negatives too; `exact` is then a softmax over every candidate pair (rows
    recomputed in the backward pass to bound memory). Training and inference normalise differently.
  Measured on SQuAD (BENCHMARKS.md, "MaP reproduction"): `block` trains far more slowly.
- `k` (§2.4, the paper's 20): the sampling size.
- `inference`: `topk` (the rows of the `inference_k` most probable first positions) or `exact`
  (every row). A row's softmax runs over the whole context (Eq. 7), so a row costs s·l whatever the
  band; the band j ∈ [i, i + max_answer_len) is applied after the softmax, and only rows, never
  the whole (b, s, s, l) tensor, are materialised.
- `width`: l, the additive-attention width (default: the hidden size).

`ensemble`, `inference` and `inference_k` decide only how a trained head decodes (no weight depends
on them): evaluation may change them (`posbias evaluate --set model.head_options.ensemble=false`, an
experiment method's `decode:`), so one MaP_E checkpoint is also scored as its forward direction alone.

Scores are log-probabilities, so windows and directions compare directly.

Shape legend: b batch, s sequence, d hidden, l width, r rows kept, c columns kept, L band width.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ...errors import ConfigError
from ...registry import HEADS
from .pointer import AdditivePointer, QuestionPooling, check_width, cross_entropy, question_mask, reads_wait, upcast
from .span_scores import band_from_matrix, candidate_mask, masked_logits

CHUNK_ELEMENTS = 1 << 24  # with gradient, tanh inputs per chunk of rows: (b, r, s, l) <= 16M floats = 64 MB
CACHE_ELEMENTS = 1 << 20  # without, on a CPU, per block of (examples, rows): (e, r, c, l) <= 1M floats = 4 MB
NEG = float("-inf")
KEY = {"forward": "fwd", "backward": "bwd"}
DECODE_OPTIONS = ("ensemble", "inference", "inference_k")  # options evaluation may change (set_decoding)


class PairScorer(nn.Module):
    """Eq. 7's logits z(i, j) = vᵀ tanh(V₁H_j + V₂H_i): i the condition (row), j the predicted (column)."""

    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.col = nn.Linear(hidden_size, width, bias=False)  # V₁, applied to H_j
        self.row = nn.Linear(hidden_size, width, bias=False)  # V₂, applied to H_i
        self.v = nn.Linear(width, 1, bias=False)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.col(hidden)  # A: (b, s, l)

    def project_rows(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """B_i = V₂H_i for the rows `rows` (b, r) only: (b, r, l)."""
        return self.row(hidden.gather(1, rows[:, :, None].expand(-1, -1, hidden.shape[-1])))

    def _rows(self, a: torch.Tensor, b_rows: torch.Tensor) -> torch.Tensor:
        return self.v(torch.tanh(a[:, None, :, :] + b_rows[:, :, None, :])).squeeze(-1)  # (b, r, s)

    def rows(self, a: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor,
             cols: torch.Tensor | None = None) -> torch.Tensor:
        """(b, r, s) logits of rows `rows` (b, r) against every column, or only the columns where
        `cols` (b, s) is True (the others come back -inf): a softmax over candidates needs no more.
        `a` is `project(hidden)`.

        With gradient: chunks of rows over the batch, each recomputed in backward (checkpointing).
        Without: blocks of (examples, rows) of the whole batch, in place, a block's (e, r, c, l) tanh
        input within a budget: on a CPU small enough to stay in cache (CACHE_ELEMENTS; about 2x
        faster than whole-batch chunks), so a long window's rows go one example at a time; on a GPU
        CHUNK_ELEMENTS, few blocks for the batch. The columns computed are on a CPU those some example
        of the batch has as candidates, on a GPU all of them (choosing them would be a host read,
        `reads_wait`); the others come back -inf as before.
        """
        n, s, width = a.shape
        b_rows = self.project_rows(hidden, rows)  # (b, r, l)
        if torch.is_grad_enabled() and (a.requires_grad or b_rows.requires_grad):
            step = max(1, CHUNK_ELEMENTS // max(1, n * s * width))
            # Keep only each chunk's inputs for backward: the (b, r, s, l) tanh is recomputed.
            z = torch.cat([checkpoint(self._rows, a, b_rows[:, c:c + step], use_reentrant=False)
                           for c in range(0, rows.shape[1], step)], dim=1)
            return z if cols is None else z.masked_fill(~cols[:, None, :], NEG)
        v = self.v.weight[0]  # (l,)
        idx = None
        if cols is not None and not reads_wait(cols):
            idx = cols.any(0).nonzero().squeeze(1)  # (c,) the batch's candidate columns
            a = a[:, idx]  # (b, c, l)
        r, c = rows.shape[1], a.shape[1]
        budget = CACHE_ELEMENTS if a.device.type == "cpu" else CHUNK_ELEMENTS
        rs = min(r, max(1, budget // max(1, c * width)))  # rows per block
        es = max(1, budget // max(1, rs * c * width))  # examples per block
        z = a.new_empty((n, r, c))
        for e in range(0, n, es):
            for q in range(0, r, rs):
                x = a[e:e + es, None] + b_rows[e:e + es, q:q + rs, None]  # (e, rs, c, l)
                z[e:e + es, q:q + rs] = torch.tanh_(x) @ v  # (e, rs, c)
        if idx is not None:
            out = a.new_full((n, r, s), NEG)
            out[:, :, idx] = z
            z = out
        return z if cols is None else z.masked_fill_(~cols[:, None, :], NEG)

    def pairs(self, a: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(b, r, c) logits z(rows[b, r], cols[b, r, c]): the sampled block of Eq. 8-12."""
        n, r, c = cols.shape
        width = a.shape[-1]
        a_cols = a.gather(1, cols.reshape(n, r * c, 1).expand(-1, -1, width)).reshape(n, r, c, width)
        b_rows = self.project_rows(hidden, rows)  # (b, r, l)
        return self.v(torch.tanh(a_cols + b_rows[:, :, None, :])).squeeze(-1)


class Direction(nn.Module):
    """One conditional direction: the first-position pointer (Eq. 4-6) and the matrix (Eq. 7)."""

    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.pool = QuestionPooling(hidden_size, width)
        self.pointer = AdditivePointer(hidden_size, width, hidden_size)
        self.pairs = PairScorer(hidden_size, width)

    def forward(self, hidden: torch.Tensor, qmask: torch.Tensor, mask: torch.Tensor) -> dict:
        first = masked_logits(self.pointer(hidden, self.pool(hidden, qmask)), mask)  # (b, s)
        return {"first": first, "a": self.pairs.project(hidden), "hidden": hidden}

    def row_log_probs(self, d: dict, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(b, r, s) log P_second(row, ·): Eq. 7's softmax over the candidates of each row."""
        z = upcast(self.pairs.rows(d["a"], d["hidden"], rows, mask))
        return z.masked_fill(~mask[:, None, :], NEG).log_softmax(-1)

    def loss(self, d: dict, mask: torch.Tensor, gold_first: torch.Tensor, gold_second: torch.Tensor,
             training: str, k: int, normalization: str = "row") -> torch.Tensor:
        """½(L_first + L_second), Eq. 10-12."""
        first = d["first"]
        n, s = first.shape
        if normalization == "row":
            # Eq. 12 as written: P̂ holds Eq. 7's row-normalised probabilities, so the one-hot picks
            # -log P̂(gold_first, gold_second); the other sampled rows carry no loss term and are not
            # computed. Sampled: the row's softmax runs over its k sampled columns (Fig. 5: the
            # unsampled entries do not change); exact: over every candidate of the gold row.
            rows, row_ok = gold_first[:, None], torch.ones_like(gold_first[:, None], dtype=torch.bool)
        elif training == "exact":
            rows, row_ok = torch.arange(s, device=first.device).expand(n, s), mask
        else:
            rows, row_ok = _top_but_gold(first, mask, gold_first, k)  # Eq. 8-9: (b, r)
        if training == "exact":
            z = upcast(self.pairs.rows(d["a"], d["hidden"], rows))  # (b, r, s)
            valid = row_ok[:, :, None] & mask[:, None, :]
            gold_row = 0 if normalization == "row" else gold_first  # rows: the gold one, or every position
            target = gold_row * s + gold_second
        else:
            with torch.no_grad():
                z_rows = self.pairs.rows(d["a"], d["hidden"], rows, mask)  # (b, r, s), only to pick columns
            cols, col_ok = _top_but_gold(upcast(z_rows), mask[:, None, :].expand_as(z_rows),
                                         gold_second[:, None].expand(-1, rows.shape[1]), k)  # (b, r, c)
            z = upcast(self.pairs.pairs(d["a"], d["hidden"], rows, cols))  # (b, r, c), with gradient
            valid = row_ok[:, :, None] & col_ok
            target = torch.full_like(gold_first, rows.shape[1] * cols.shape[2] - 1)  # gold: last row, last column
        z = masked_logits(z, valid).reshape(n, -1)  # Eq. 12: 𝒯, the row-wise flatten
        return (cross_entropy(first, gold_first) + cross_entropy(z, target)) / 2


def _top_but_gold(scores: torch.Tensor, ok: torch.Tensor, gold: torch.Tensor, k: int):
    """Eq. 8-9 along the last axis: the top k-1 candidates other than `gold`, then `gold` (last).

    Returns (indices (..., k'), ok (..., k')), k' = min(k, n); picks that are not candidates (rows
    with fewer than k-1 of them) come back with ok False.
    """
    n = scores.shape[-1]
    kk = min(k, n) - 1
    ranked = scores.detach().masked_fill(~ok, NEG).scatter(-1, gold[..., None], NEG)
    top = ranked.topk(kk, dim=-1).indices if kk > 0 else gold[..., None][..., :0]
    top_ok = ok.gather(-1, top) & (top != gold[..., None])
    return torch.cat([top, gold[..., None]], -1), torch.cat([top_ok, torch.ones_like(top_ok[..., :1])], -1)


class MatrixHead(nn.Module):
    DIRECTIONS = ("forward", "backward", "both")

    def __init__(self, hidden_size: int, null_answer: bool = False, *, direction: str = "forward",
                 ensemble: bool | None = None, training: str = "sampled", k: int = 20,
                 inference: str = "topk", inference_k: int = 20, width: int | None = None,
                 normalization: str = "row"):
        super().__init__()
        if direction not in self.DIRECTIONS:
            raise ConfigError(f"model.head_options.direction must be one of {list(self.DIRECTIONS)}, got {direction!r}")
        ensemble = _check_decoding(direction, null_answer, ensemble, inference, inference_k)
        if training not in ("sampled", "exact"):
            raise ConfigError(f"model.head_options.training must be 'sampled' or 'exact', got {training!r}")
        if normalization not in ("row", "block"):
            raise ConfigError(f"model.head_options.normalization must be 'row' or 'block', got {normalization!r}")
        _check_int_option("k", k)
        width = check_width(width, hidden_size)
        self.null_answer = null_answer
        self.direction, self.ensemble = direction, ensemble
        self.training_mode, self.k, self.normalization = training, k, normalization
        self.inference, self.inference_k = inference, inference_k
        # ModuleDict keys cannot be "forward" (nn.Module.forward): fwd / bwd.
        self.directions = nn.ModuleDict({KEY[name]: Direction(hidden_size, width) for name in KEY
                                         if direction in (name, "both")})

    def set_decoding(self, **options) -> None:
        """Decode a trained head another way: `DECODE_OPTIONS` only (no weight depends on them),
        checked as at construction. A `both` checkpoint decodes as MaP_E (`ensemble=True`) or as its
        forward direction alone (`ensemble=False`, MaP_F's decoding; §2.6)."""
        unknown = sorted(set(options) - set(DECODE_OPTIONS))
        if unknown:
            raise ConfigError(f"model.head_options.{unknown[0]} is not a decoding option of head 'matrix' "
                              f"(those are {list(DECODE_OPTIONS)}): it cannot change after training")
        now = {"ensemble": self.ensemble, "inference": self.inference, "inference_k": self.inference_k} | options
        self.ensemble = _check_decoding(self.direction, self.null_answer, now["ensemble"], now["inference"],
                                        now["inference_k"])
        self.inference, self.inference_k = now["inference"], now["inference_k"]

    def _trained(self) -> list[str]:
        return [name for name in KEY if KEY[name] in self.directions]

    def dir(self, name: str) -> Direction:
        return self.directions[KEY[name]]

    # ------------------------------------------------------------------------------------ forward
    def forward(self, hidden: torch.Tensor, batch: dict, targets: dict | None = None) -> dict:
        mask = candidate_mask(batch["span_mask"], batch["cls_index"], self.null_answer)  # (b, s)
        qmask = question_mask(batch)
        out = {"mask": mask}
        for name in self._trained():
            out[name] = self.dir(name)(hidden, qmask, mask)
        if targets is not None:
            gold = {"forward": (targets["start_positions"], targets["end_positions"]),
                    "backward": (targets["end_positions"], targets["start_positions"])}
            losses = [self.dir(name).loss(out[name], mask, *gold[name], self.training_mode, self.k,
                                               self.normalization)
                      for name in self._trained()]
            out["loss"] = sum(losses) / len(losses)
        return out

    # ----------------------------------------------------------------------------------- decoding
    def _decoding(self) -> list[str]:
        if self.ensemble:
            return ["forward", "backward"]
        return ["backward"] if self.direction == "backward" else ["forward"]

    def _direction_top(self, name: str, scores: dict, start_ok, end_ok, max_answer_len: int, k: int,
                       rows_k: int | None):
        """Top-k spans of one direction: (scores, starts, ends) (b, k'), -inf / -1 where none."""
        d, mask = scores[name], scores["mask"]
        first_ok, second_ok = (start_ok, end_ok) if name == "forward" else (end_ok, start_ok)
        first = upcast(d["first"]).log_softmax(-1).masked_fill(~first_ok, NEG)  # (b, s)
        n, s = first.shape
        if rows_k is None:
            rows = torch.arange(s, device=first.device).expand(n, s)  # (b, r = s)
        else:
            rows = first.topk(min(rows_k, s), dim=1).indices  # (b, r)
        logp = self.dir(name).row_log_probs(d, rows, mask)  # (b, r, s)
        width = min(max_answer_len, s)
        step = torch.arange(width, device=first.device)
        second = rows[:, :, None] + (step if name == "forward" else -step)  # (b, r, L)
        inside = (second >= 0) & (second < s)
        second = second.clamp(0, s - 1)
        ok = inside & second_ok.gather(1, second.reshape(n, -1)).reshape(second.shape)
        span = first.gather(1, rows)[:, :, None] + logp.gather(2, second)  # (b, r, L)
        span = span.masked_fill(~ok, NEG).reshape(n, -1)
        top, idx = span.topk(min(k, span.shape[1]), dim=1)  # (b, k')
        i, j = rows.gather(1, idx // width), second.reshape(n, -1).gather(1, idx)
        starts, ends = (i, j) if name == "forward" else (j, i)
        bad = torch.isinf(top)
        return top, starts.masked_fill(bad, -1), ends.masked_fill(bad, -1)

    def top_spans(self, scores: dict, start_ok, end_ok, max_answer_len: int, k: int):
        """Top-k spans by log p_first(i) + log P_second(i, j) (§2.6); with `ensemble`, MaP_E's merge."""
        rows_k = self.inference_k if self.inference == "topk" else None
        results = [self._direction_top(name, scores, start_ok, end_ok, max_answer_len, k, rows_k)
                   for name in self._decoding()]
        if len(results) == 1:
            return results[0]
        return ensemble_merge(results[0], results[1], k)

    def span_scores(self, scores: dict, max_answer_len: int) -> torch.Tensor:
        """(b, L, s) band of one direction's exact span scores (every row); not defined for the
        ensemble, which is a merge of two top-k lists (use `top_spans`)."""
        if self.ensemble:
            raise ConfigError("the MaP ensemble has no span band (§2.6 merges two top-k lists); decode with top_spans")
        name = self._decoding()[0]
        d, mask = scores[name], scores["mask"]
        first = upcast(d["first"]).log_softmax(-1)  # (b, s)
        n, s = first.shape
        rows = torch.arange(s, device=first.device).expand(n, s)
        matrix = first[:, :, None] + self.dir(name).row_log_probs(d, rows, mask)  # [first, second]
        if name == "backward":
            matrix = matrix.transpose(1, 2)  # [start, end]
        return band_from_matrix(matrix, min(max_answer_len, s))

    def null_scores(self, scores: dict, cls_index: torch.Tensor) -> torch.Tensor:
        """log p_first([CLS]) + log P_second([CLS], [CLS]) of the decoding direction (b,)."""
        name = self._decoding()[0]
        d = scores[name]
        first = upcast(d["first"]).log_softmax(-1)
        logp = self.dir(name).row_log_probs(d, cls_index[:, None], scores["mask"])  # (b, 1, s)
        rows = torch.arange(cls_index.shape[0], device=cls_index.device)
        return first[rows, cls_index] + logp[rows, 0, cls_index]


def _check_int_option(key: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ConfigError(f"model.head_options.{key} must be an integer >= 2, got {value!r}")


def _check_decoding(direction: str, null_answer: bool, ensemble, inference, inference_k) -> bool:
    """The decoding options checked against the head's directions; `ensemble` resolved (None: the
    default, on for `both`)."""
    if ensemble is not None and not isinstance(ensemble, bool):
        raise ConfigError(f"model.head_options.ensemble must be true, false or null, got {ensemble!r}")
    ensemble = (direction == "both") if ensemble is None else ensemble
    if ensemble and direction != "both":
        raise ConfigError("model.head_options.ensemble needs direction: both (the ensemble joins both directions)")
    if ensemble and null_answer:
        raise ConfigError("model.head_options.ensemble is not supported with SQuAD v2 null answers "
                          "(§2.6 defines it on span pairs); use ensemble: false")
    if inference not in ("topk", "exact"):
        raise ConfigError(f"model.head_options.inference must be 'topk' or 'exact', got {inference!r}")
    _check_int_option("inference_k", inference_k)
    return ensemble


def ensemble_merge(fwd, bwd, k: int):
    """§2.6: F ∪ (B minus the pairs already in F), best first, top k. Each is (scores, starts, ends) (b, k)."""
    f_sc, f_st, f_en = fwd
    b_sc, b_st, b_en = bwd
    dup = ((b_st[:, :, None] == f_st[:, None, :]) & (b_en[:, :, None] == f_en[:, None, :])
           & (f_st[:, None, :] >= 0)).any(-1)  # (b, kb): the pair is already in F
    b_sc = b_sc.masked_fill(dup, NEG)
    sc = torch.cat([f_sc, b_sc], 1)
    top, idx = sc.topk(min(k, sc.shape[1]), dim=1)
    st = torch.cat([f_st, b_st], 1).gather(1, idx)
    en = torch.cat([f_en, b_en], 1).gather(1, idx)
    bad = torch.isinf(top)
    return top, st.masked_fill(bad, -1), en.masked_fill(bad, -1)


@HEADS.register("matrix", decode_options=DECODE_OPTIONS)
def matrix(hidden_size: int, null_answer: bool = False, **options) -> MatrixHead:
    return MatrixHead(hidden_size, null_answer, **options)
