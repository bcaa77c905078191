"""Scores kept on disk as they are computed, so that a killed or repeated diagnosis resumes.

One append-only JSON Lines file per model (its fingerprint), precision and scoring: each line maps the hash of
what was scored (the prompt's token ids, the answer's or the generation settings, and the condition,
e.g. Ms-PoE's ratios) to its score. A batch's lines are written and flushed when the batch is done,
so a kill loses at most the batch in flight; a torn last line (a kill mid-write) is skipped on
reading. Nothing in the file is executed or unpickled: it is JSON, and a value of the wrong type is
ignored (recomputed), as is a non-finite log-likelihood, a line longer than any score writes
(`MAX_LINE`) and one nested too deeply to parse.

The cache writes only its own files: no folder between `--cache-dir` and the file, nor the file, may be a
symbolic link (a link would send the appended lines into another folder), and the file must be a regular
file (a FIFO there would block the run forever).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path

from ..errors import ConfigError

MAX_LINE = 1 << 20
"""Bytes of one cache line at most: a score is ~70 bytes, a generated answer a few KB."""
MAX_FILE = 2 << 30
"""Bytes of one cache file at most: 10 million scores of the largest grids are under 1 GB."""


def item_key(*parts) -> str:
    """A stable hash of JSON-able parts (lists of token ids, strings, numbers)."""
    return hashlib.sha1(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


def _check_path(folder: Path, file: Path) -> None:
    """Refuse a link anywhere from `folder` down to `file`, and a `file` that is not a regular file."""
    parts = file.relative_to(folder).parts
    path = folder
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise ConfigError(f"--cache-dir: {path} is a symbolic link (to {os.readlink(path)}); the score cache "
                              "writes only its own files, never through a link: remove the link")
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ConfigError(f"--cache-dir: {file} is not a regular file (a FIFO, device or folder); remove it")


def _lines(file: Path):
    """Each line of `file` up to MAX_LINE bytes; a longer one is skipped whole, never held in memory."""
    with open(file, "rb") as f:
        while True:
            line = f.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while True:  # drop the rest of the overlong line
                    rest = f.readline(MAX_LINE)
                    if not rest or rest.endswith(b"\n"):
                        break
                continue
            yield line


class ScoreCache:
    """`key -> score` for one model, precision and scoring, in
    `folder/generation/<fingerprint>/<precision>/<kind>.jsonl` (module docstring): a bf16 run never reads
    an fp32 run's scores. `folder` None keeps scores in memory only."""

    def __init__(self, folder, fingerprint: str, precision: str, kind: str, value_type: type):
        self.kind, self.value_type = kind, value_type
        self.folder = None if folder is None else Path(folder)
        self.file = (None if folder is None
                     else Path(folder) / "generation" / fingerprint / precision / f"{kind}.jsonl")
        self.values: dict[str, object] = {}
        self.skipped = 0
        if self.file is not None:
            _check_path(self.folder, self.file)
        if self.file is not None and self.file.is_file():
            if self.file.stat().st_size > MAX_FILE:
                raise ConfigError(f"--cache-dir: {self.file} is larger than {MAX_FILE >> 30} GiB, more than any "
                                  "diagnosis writes: it is not a score cache; remove it")
            for line in _lines(self.file):
                try:
                    rec = json.loads(line.decode("utf-8", errors="replace"))
                except (ValueError, RecursionError):  # a line torn by a kill mid-write, or damaged
                    self.skipped += 1
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
        _check_path(self.folder, self.file)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        _check_path(self.folder, self.file)  # a link made between the check and the folders
        fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"k": k, "v": v}) + "\n" for k, v in items.items()))
            f.flush()
            os.fsync(f.fileno())
