"""Position-embedding updates (Random Padding paper §2.3 pilot), for every task: which position ids
received a gradient in how many optimizer steps.

With several processes a step's gradient is the all-reduced sum of every process's batches, so a
position counts in a step when any process saw it: each process keeps its steps' seen-sets until
`merge_processes` ORs them over the processes (when the counts are written), which makes N
processes count what one process with N times the gradient accumulation counts over the same
batches."""
from __future__ import annotations

import numpy as np


class PositionUpdateCounter:
    """§2.3 pilot: for each position id, the number of optimizer steps in which it received a
    gradient, i.e. appeared on a real (non-padding) token of the step's batches."""

    def __init__(self, n_positions: int, processes: int = 1):
        self.counts = np.zeros(n_positions, dtype=np.int64)  # this process's own until `merge_processes`
        self.steps = 0
        self._step_seen = np.zeros(n_positions, dtype=bool)
        # With several processes: each step's seen-set since the last merge, packed (n_positions / 8 bytes).
        self._unmerged: list[np.ndarray] | None = [] if processes > 1 else None

    def add_batch(self, position_ids, attention_mask) -> None:
        ids = position_ids[attention_mask.bool()].unique().cpu().numpy()
        self._step_seen[ids[ids < len(self._step_seen)]] = True

    def add_model_batch(self, model, batch: dict) -> None:
        """`add_batch` with the position ids `model` actually gives its encoder for `batch`: the
        model's `encoder_position_ids(batch)` -> (ids, real-slot mask) when it has one (QA: DyReF's
        two queries take the first ids of the table and every token's id moves by 2), else the
        batch's (perturbed) ids or the model's default numbering over the attention mask."""
        if hasattr(model, "encoder_position_ids"):
            self.add_batch(*model.encoder_position_ids(batch))
            return
        pos = batch.get("position_ids")
        self.add_batch(pos if pos is not None else model.position_ids(batch["attention_mask"]), batch["attention_mask"])

    def end_step(self) -> None:
        self.counts += self._step_seen
        self.steps += 1
        if self._unmerged is not None:
            self._unmerged.append(np.packbits(self._step_seen))
        self._step_seen[:] = False

    def merge_processes(self, gather_object) -> None:
        """Make `counts` count every process's batches: a position counts in a step when any process
        saw it in that step. A collective: every process calls it at the same step, with
        `gather_object` (accelerate's: a list -> the lists of all processes, joined in rank order);
        afterwards every process holds the same counts. A no-op in a single process."""
        if self._unmerged is None:
            return
        n = len(self._step_seen)
        mine = (np.stack(self._unmerged) if self._unmerged
                else np.zeros((0, (n + 7) // 8), dtype=np.uint8))  # (steps since the last merge, bytes)
        every = gather_object([mine])  # one array per process, each with the same number of steps
        seen_by_any = np.bitwise_or.reduce(np.stack(every), axis=0)
        unpack = lambda packed: np.unpackbits(packed, axis=1, count=n).sum(0, dtype=np.int64)  # noqa: E731
        self.counts += unpack(seen_by_any) - unpack(mine)  # this process's own counts were added by end_step
        self._unmerged.clear()

    def to_dict(self) -> dict:
        return {"steps": self.steps, "counts": self.counts.tolist()}

    @staticmethod
    def fractions(d: dict) -> np.ndarray:
        return np.asarray(d["counts"], dtype=np.float64) / max(d["steps"], 1)
