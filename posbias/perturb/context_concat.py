"""Context Perturbation (Ben Amor et al., "Impact of Position Bias on Language Models in Token
Classification", §4.2), as a training-time perturbation of tagging batches.

The rows of a batch are split into groups whose concatenation fits M tokens (greedily, in batch
order, as the authors' code does); a group of n rows gives n concatenations, in n distinct random
orders (p_1 .. p_n), so the batch keeps its size:
    t_concat = prefix ⊕ t_p1 ⊕ [SEP] ⊕ t_p2 ⊕ [SEP] ... ⊕ t_pn ⊕ suffix
where t is a row's body (its real tokens without the tokenizer's own prefix/suffix specials),
[SEP] the tokenizer's separator and prefix/suffix its specials: with BERT this is the paper's
[CLS] s1 [SEP] s2 [SEP] ... sn [SEP]. Every token keeps its label, word index and predict flag;
specials and separators carry none. Each sentence thus moves to other positions and sees other
sentences as context. A group may be a single row (one longer than M by itself, or one that fits
next to neither neighbour): that row is then unchanged.

Differences from the authors' code (method/batch_concat.py): no hard-coded ids ([CLS] = 101,
pad = 0: read off the tokenizer here), separators from the tokenizer (their rows keep their own
[SEP]: the same tokens for BERT), rows padded to the longest concatenation instead of always to
max_length, and randomness from the passed generator.

Shape legend: b batch (rows in = rows out), s sequence (longest output row), n group size, n_max
largest group of the batch.
"""
from __future__ import annotations

from typing import Annotated

import torch

from ..errors import ConfigError
from ..registry import PERTURBATIONS
from ..typed import Bound
from ..tokens import IGNORE, separator_id, special_tokens

# Batch fields this perturbation rebuilds; anything else would be left describing the old rows.
ROW_FIELDS = {"input_ids", "attention_mask", "word_index", "predict", "labels", "token_type_ids"}
DROPPED = {"position_ids", "position_shift"}  # a later RPP, or the model's own numbering, applies
OTHER_FIELDS = {"cls_index", "pad_left", "window"}


def group_rows(body_lengths: list[int], overhead: int, max_len: int) -> list[list[int]]:
    """Consecutive groups of rows whose concatenation fits `max_len`, formed greedily in order.

    A group of bodies costs `overhead` (prefix + suffix specials) + their lengths + one separator
    between consecutive bodies. A row that does not fit next to the current group starts the next
    group; a row longer than `max_len` by itself stays alone.
    """
    groups: list[list[int]] = []
    cost = 0
    for r, n_tok in enumerate(body_lengths):
        if groups and cost + 1 + n_tok <= max_len:  # + 1: the separator before this body
            groups[-1].append(r)
            cost += 1 + n_tok
        else:
            groups.append([r])
            cost = overhead + n_tok
    return groups


def distinct_permutations(n: int, generator: torch.Generator) -> list[list[int]]:
    """n distinct orders of range(n), each uniform over all n! (rejection of repeats; n <= n!)."""
    seen: list[list[int]] = []
    while len(seen) < n:
        perm = torch.randperm(n, generator=generator).tolist()
        if perm not in seen:  # the paper's n *different* arrangements
            seen.append(perm)
    return seen


def concatenate_contexts(batch: dict, generator: torch.Generator, *, max_len: int, prefix: list[int],
                         suffix: list[int], sep_id: int, pad_id: int, padding_side: str = "right") -> dict:
    """A new batch of the same size: each group of rows concatenated in distinct random orders.

    Args:
        batch: a tagging batch (posbias/tagging/collate.py): input_ids, attention_mask, word_index,
            predict (b, s); cls_index, pad_left, window (b,); optional labels, token_type_ids
            (b, s); optional position_ids / position_shift (dropped).
        max_len: M, the most tokens of a concatenation, specials and separators included.
        prefix, suffix: the tokenizer's special ids around one sequence (`special_tokens`).
        sep_id: the separator between bodies (`separator_id`).

    Returns the rebuilt fields plus `concat_rows` (b, n_max) int64: the source rows of each output
    row in order, -1 padded.
    """
    unknown = set(batch) - ROW_FIELDS - DROPPED - OTHER_FIELDS
    if unknown:
        raise ValueError(f"context perturbation cannot rebuild batch field(s) {sorted(unknown)} "
                         "(is this a tagging batch, perturbed once only?)")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be left or right, got {padding_side!r}")
    mask = batch["attention_mask"].bool()  # (b, s)
    words = mask & (batch["word_index"] >= 0)  # (b, s) tokens of a word: the body's ends
    b = mask.shape[0]
    bodies = []  # per row, [start, end) of its body: real tokens from its first word token to its last
    for r in range(b):
        at = torch.nonzero(words[r]).flatten()
        bodies.append((int(at[0]), int(at[-1]) + 1) if len(at) else (0, 0))
    groups = group_rows([e - a for a, e in bodies], len(prefix) + len(suffix), max_len)

    fields = [k for k in ("input_ids", "word_index", "predict", "labels") if k in batch]
    fill = {"input_ids": sep_id, "word_index": -1, "predict": False, "labels": IGNORE}  # on [SEP]
    edge = {"input_ids": (prefix, suffix), "word_index": ([-1] * len(prefix), [-1] * len(suffix)),
            "predict": ([False] * len(prefix), [False] * len(suffix)),
            "labels": ([IGNORE] * len(prefix), [IGNORE] * len(suffix))}
    values = {k: batch[k].tolist() for k in fields}
    rows: list[dict[str, list]] = []  # output row -> field -> its values, unpadded
    sources: list[list[int]] = []
    for group in groups:
        perms = distinct_permutations(len(group), generator) if len(group) > 1 else [[0]]
        for perm in perms:
            order = [group[i] for i in perm]
            row = {}
            for k in fields:
                vals = values[k]
                seq = list(edge[k][0])
                for j, src in enumerate(order):
                    if j:
                        seq.append(fill[k])
                    a, e = bodies[src]
                    seq.extend(vals[src][a:e])
                row[k] = seq + list(edge[k][1])
            rows.append(row)
            sources.append(order)

    s = max(len(r["input_ids"]) for r in rows)
    n_max = max(len(o) for o in sources)
    lens = torch.tensor([len(r["input_ids"]) for r in rows])  # (b,)
    pad_left = s - lens if padding_side == "left" else torch.zeros(b, dtype=torch.long)  # (b,)
    pad_value = {"input_ids": pad_id, "word_index": -1, "predict": False, "labels": IGNORE}
    out: dict[str, torch.Tensor] = {}
    for k in fields:
        t = torch.full((b, s), pad_value[k], dtype=batch[k].dtype)  # (b, s)
        for r, row in enumerate(rows):
            t[r, int(pad_left[r]): int(pad_left[r]) + len(row[k])] = torch.tensor(row[k], dtype=batch[k].dtype)
        out[k] = t
    slots = torch.arange(s)[None]  # (1, s)
    real = (slots >= pad_left[:, None]) & (slots < (pad_left + lens)[:, None])  # (b, s)
    out["attention_mask"] = real.to(batch["attention_mask"].dtype)
    if "token_type_ids" in batch:  # one segment: the concatenation is a single "sentence"
        out["token_type_ids"] = torch.zeros((b, s), dtype=batch["token_type_ids"].dtype)
    concat_rows = torch.full((b, n_max), -1, dtype=torch.long)  # (b, n_max)
    for r, order in enumerate(sources):
        concat_rows[r, : len(order)] = torch.tensor(order)
    out["concat_rows"] = concat_rows
    out["cls_index"] = pad_left.clone() if prefix else torch.full((b,), -1, dtype=torch.long)
    out["pad_left"] = pad_left.to(batch["pad_left"].dtype)
    out["window"] = batch["window"][concat_rows[:, 0]]  # (b,) the window of each row's first sentence
    return out


class ContextPerturbation:
    """Training-time Context Perturbation; `bind(model, tokenizer)` reads the tokenizer's special
    tokens, separator, pad id and padding side, and refuses an M past the position table.

    `paper_mode` augment: the authors' training step adds the concatenated batch to the clean one
    (experiments/bert_position_bias.py); the paper is silent on a clean pass. `rebuilds_rows`: the
    rows are numbered afresh (`DROPPED`), so a position shift set before it in replace mode is lost
    (refused in `posbias.perturb.check_combination`)."""

    paper_mode = "augment"
    rebuilds_rows = True

    def __init__(self, max_len: int, key: str):
        self.max_len = max_len
        self.key = key  # the dotted config key, for error messages
        self.tokens: dict | None = None

    def bind(self, model, tokenizer) -> None:
        n_pos = getattr(model.encoder.config, "max_position_embeddings", None)
        base = getattr(model, "position_base", 0)
        if n_pos is not None and base + self.max_len > n_pos:
            raise ConfigError(
                f"{self.key}.max_len ({self.max_len}) + first position id ({base}) exceeds the encoder's "
                f"max_position_embeddings ({n_pos}); lower {self.key}.max_len (default data.max_seq_len)")
        prefix, suffix = special_tokens(tokenizer)
        self.tokens = {"prefix": prefix, "suffix": suffix, "sep_id": separator_id(tokenizer),
                       "pad_id": tokenizer.pad_token_id, "padding_side": tokenizer.padding_side}

    def __call__(self, batch: dict, generator: torch.Generator) -> dict:
        if self.tokens is None:
            raise RuntimeError(f"{self.key}: context_perturbation needs bind(model, tokenizer) before use")
        return concatenate_contexts(batch, generator, max_len=self.max_len, **self.tokens)


@PERTURBATIONS.register("context_perturbation")
def context_perturbation(*, max_len: Annotated[int, Bound(1, what="a positive integer")] | None = None,
                         max_seq_len: int | None = None, task: str | None = None,
                         key: str = "perturb[0]") -> ContextPerturbation:
    """Options: `max_len` M (default data.max_seq_len; the paper uses the whole table, 512)."""
    if task not in (None, "tagging"):
        raise ConfigError(f"{key}: context_perturbation concatenates tagging sentences; task {task!r} "
                          "has no word labels to carry along")
    if max_len is None:
        max_len = max_seq_len
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ConfigError(f"{key}.max_len must be a positive integer, got {max_len!r}")
    return ContextPerturbation(max_len, key)
