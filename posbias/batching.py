"""Batch order, shared by every task: a recorded, seed-determined order with length grouping.

Shape legend: b items in a batch, s = longest item in the batch (no padding to max_seq_len).
"""
from __future__ import annotations

import numpy as np


def batch_order(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, *,
                length_grouping: bool = True, group_batches: int = 50) -> list[np.ndarray]:
    """The epoch's batches of window indices; a pure function of (lengths, seed, epoch).

    Every method run with the same seed sees the same batches in the same order (the papers'
    "identical order of training instances"): the order is drawn from the windows' lengths before
    any perturbation, and perturbations act on a batch once it is drawn (Context Perturbation
    concatenates rows within it), so they never change which windows form a batch.

    With `length_grouping`, windows are shuffled, cut into pools of `group_batches` batches, sorted by
    length inside each pool and the resulting batches shuffled again: batches hold windows of
    similar length, so dynamic padding wastes little, while the order stays random.
    """
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    if not length_grouping:
        return [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]
    pool = batch_size * group_batches
    batches = []
    for p in range(0, len(perm), pool):
        chunk = perm[p:p + pool]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def eval_batches(order: np.ndarray, lengths: np.ndarray, batch_size: int,
                 max_tokens: int | None = None) -> list[np.ndarray]:
    """Consecutive slices of `order` (indices sorted longest first) for evaluation: at most
    `batch_size` items, and at most `max_tokens` padded tokens (items x the slice's first, longest,
    length; always at least one item). The memory of a forward pass grows with the tokens in flight,
    so the budget bounds it whatever the sequence length; None: `batch_size` alone."""
    out, b = [], 0
    while b < len(order):
        n = batch_size
        if max_tokens is not None:
            n = min(n, max(1, max_tokens // max(1, int(lengths[order[b]]))))
        out.append(order[b:b + n])
        b += n
    return out


def move(batch: dict, device) -> dict:
    """The batch's tensors on `device`."""
    return {k: v.to(device) for k, v in batch.items()}
