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
        self._step_seen[:] = False

    def to_dict(self) -> dict:
        return {"steps": self.steps, "counts": self.counts.tolist()}

    @staticmethod
    def fractions(d: dict) -> np.ndarray:
        return np.asarray(d["counts"], dtype=np.float64) / max(d["steps"], 1)
