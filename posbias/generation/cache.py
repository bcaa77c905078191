"""Scores kept on disk as they are computed, so that a killed or repeated diagnosis resumes.

One append-only JSON Lines file per model (its fingerprint), precision and scoring: each line maps the hash of
what was scored (the prompt's token ids, the answer's or the generation settings, and the condition,
e.g. Ms-PoE's ratios) to its score. A batch's lines are written and flushed when the batch is done,
so a kill loses at most the batch in flight; a torn last line (a kill mid-write) is skipped on
reading. Nothing in the file is executed or unpickled: it is JSON, and a value of the wrong type is
ignored (recomputed), as is a non-finite log-likelihood.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path


def item_key(*parts) -> str:
    """A stable hash of JSON-able parts (lists of token ids, strings, numbers)."""
    return hashlib.sha1(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


class ScoreCache:
    """`key -> score` for one model, precision and scoring, in
    `folder/generation/<fingerprint>/<precision>/<kind>.jsonl` (module docstring): a bf16 run never reads
    an fp32 run's scores. `folder` None keeps scores in memory only."""

    def __init__(self, folder, fingerprint: str, precision: str, kind: str, value_type: type):
        self.kind, self.value_type = kind, value_type
        self.file = (None if folder is None
                     else Path(folder) / "generation" / fingerprint / precision / f"{kind}.jsonl")
        self.values: dict[str, object] = {}
        if self.file is not None and self.file.is_file():
            with open(self.file, encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:  # a line torn by a kill mid-write
                        continue
                    if isinstance(rec, dict) and isinstance(rec.get("k"), str) and self._valid(rec.get("v")):
                        self.values[rec["k"]] = rec["v"]

    def _valid(self, v) -> bool:
        if self.value_type is float:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return isinstance(v, self.value_type)

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def __getitem__(self, key: str):
        return self.values[key]

    def add(self, items: dict[str, object]) -> None:
        """Keep `items` and append them to the file (flushed and synced: they survive a kill)."""
        self.values.update(items)
        if self.file is None or not items:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"k": k, "v": v}) + "\n" for k, v in items.items()))
            f.flush()
            os.fsync(f.fileno())
