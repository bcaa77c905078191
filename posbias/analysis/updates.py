"""Position-embedding updates (Random Padding paper §2.3 pilot), for every task: which position ids
received a gradient in how many optimizer steps."""
from __future__ import annotations

import numpy as np


class PositionUpdateCounter:
    """§2.3 pilot: for each position id, the number of optimizer steps in which it received a
    gradient, i.e. appeared on a real (non-padding) token of the step's batches."""

    def __init__(self, n_positions: int):
        self.counts = np.zeros(n_positions, dtype=np.int64)
        self.steps = 0
        self._step_seen = np.zeros(n_positions, dtype=bool)

    def add_batch(self, position_ids, attention_mask) -> None:
        ids = position_ids[attention_mask.bool()].unique().cpu().numpy()
        self._step_seen[ids[ids < len(self._step_seen)]] = True

    def end_step(self) -> None:
        self.counts += self._step_seen
        self.steps += 1
        self._step_seen[:] = False

    def to_dict(self) -> dict:
        return {"steps": self.steps, "counts": self.counts.tolist()}

    @staticmethod
    def fractions(d: dict) -> np.ndarray:
        return np.asarray(d["counts"], dtype=np.float64) / max(d["steps"], 1)
