"""Batch order, shared by every task: a recorded, seed-determined order with length grouping.

Shape legend: b items in a batch, s = longest item in the batch (no padding to max_seq_len).
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

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
    """The batch's tensors on `device`. To a CUDA device they are copied from pinned (page-locked)
    memory without blocking: a copy from pageable memory first waits until the GPU has run
    everything queued before it, which makes the GPU wait on Python for the next batch. A tensor
    already pinned (`Prefetch(pin=True)`) is not copied again on the host. On a CPU (or MPS, where
    pinning does not apply) a plain `.to`."""
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: (v if v.is_pinned() else v.pin_memory()).to(device, non_blocking=True) for k, v in batch.items()}


def pin(batch: dict) -> dict:
    """The batch's tensors in pinned memory (CUDA only: see `move`)."""
    return {k: v.pin_memory() for k, v in batch.items()}


class Prefetch:
    """Collates `keys` (in that order) on one background thread, at most `depth` batches ahead of
    the loop, so that the main thread only launches work on the device.

    One producer filling a FIFO queue: the batches come out in exactly the order of `keys` (the
    order `batch_order` computed), and `collate` is a pure function of its key, so a run is the
    same batch for batch as collating on the main thread. An exception in `collate` is raised by
    `get` of the batch that failed. `close` (or leaving a `with` block) stops the thread, also when
    the loop ends before the keys do (early stopping, `train.max_steps`).
    """

    def __init__(self, collate: Callable, keys, *, depth: int = 2, pin_memory: bool = False,
                 thread: bool = True):
        self._keys = list(keys)
        self._next = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(collate, pin_memory), daemon=True,
                                        name="posbias-collate")
        # thread=False: collate in `get`, on the caller's thread (the CPU: nothing to overlap with).
        self._inline = None if thread else (collate, pin_memory)
        if thread:
            self._thread.start()

    def _fill(self, collate, pin_memory: bool) -> None:
        for key in self._keys:
            try:
                item = collate(key)
                if pin_memory:
                    item = pin(item)
            except BaseException as e:  # handed to the consumer, which raises it
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put((key, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or isinstance(item, BaseException):
                return

    def get(self, key) -> dict:
        """The next batch, which must be the one of `key` (the loop and the keys agree on the order)."""
        if self._next >= len(self._keys) or self._keys[self._next] != key:
            raise RuntimeError(f"Prefetch: asked for batch {key!r}, next is "
                               f"{self._keys[self._next] if self._next < len(self._keys) else 'none'!r}")
        self._next += 1
        if self._inline is not None:
            collate, pin_memory = self._inline
            item = collate(key)
            return pin(item) if pin_memory else item
        got, item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        assert got == key, (got, key)  # one producer, FIFO: cannot differ
        return item

    def close(self) -> None:
        self._stop.set()
        if self._inline is not None:
            return
        while self._thread.is_alive():
            try:  # free a producer blocked on a full queue
                self._queue.get(timeout=0.1)
            except queue.Empty:
                pass
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
