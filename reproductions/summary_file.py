"""The maintainer scripts' inputs, read bounded and checked for shape before any script walks them:
reproductions/summary.yaml (check_summary.py, results_pages.py), reproductions/which_method.yaml
(which_method.py) and a Markdown page given to check_summary.py. A file that is missing, empty, too large,
not YAML or of the wrong shape is one line naming the file and the key (`InputError`); the scripts print it
and exit 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from posbias.config import load_yaml  # noqa: E402  (bounded, safe_load, one-line errors)
from posbias.errors import PosbiasError  # noqa: E402
from posbias.limits import MIB, read_bytes  # noqa: E402

PAGE_LIMIT = 16 * MIB
"""Bytes of a Markdown page check_summary.py reads (a built Results page is under 100 KB)."""


class InputError(ValueError):
    """A maintainer script's input file is missing, empty or malformed; the text names the file and key."""


def _yaml(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        data = load_yaml(path)
    except PosbiasError as e:
        raise InputError(str(e)) from None
    if not data:
        raise InputError(f"{path}: the file is empty")
    return data


def _need(cond: bool, path, where: str, what: str) -> None:
    if not cond:
        raise InputError(f"{path}: {where} {what}")


def _texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def load_summary(path) -> dict:
    """summary.yaml, checked: `papers` and `verdicts` mappings, `rows` a list of rows with their text cells,
    `findings` a list of texts; each row's checks and tests mappings."""
    d = _yaml(path)
    for key in ("papers", "verdicts"):
        _need(isinstance(d.get(key), dict) and d[key], path, key, "must be a non-empty mapping")
    _need(isinstance(d.get("rows"), list) and d["rows"], path, "rows", "must be a non-empty list")
    _need(d.get("findings") is None or _texts(d["findings"]), path, "findings", "must be a list of texts")
    for name, paper in d["papers"].items():
        _need(isinstance(paper, dict) and all(isinstance(paper.get(k), str) for k in ("name", "title", "about")),
              path, f"papers.{name}", "must be a mapping with name, title and about texts")
    for i, row in enumerate(d["rows"]):
        where = f"rows[{i}]"
        _need(isinstance(row, dict), path, where, "must be a mapping")
        _need(isinstance(row.get("claim"), str) and row["claim"], path, f"{where}.claim", "must be a text")
        where = f"rows[{i}] ({row['claim'][:40]!r})"
        for key in ("paper", "verdict", "regime"):
            _need(isinstance(row.get(key), str), path, f"{where}.{key}", "must be a text")
        for part in ("short", "full"):
            cells = row.get(part)
            _need(isinstance(cells, dict) and all(isinstance(cells.get(c), str) for c in ("claim", "ours", "verdict")),
                  path, f"{where}.{part}", "must be a mapping with claim, ours and verdict texts")
        _need(_texts(row.get("rerun")), path, f"{where}.rerun", "must be a list of commands")
        for key in ("experiments", "unchecked"):
            _need(row.get(key) is None or _texts(row[key]), path, f"{where}.{key}", "must be a list of texts")
        _need(row.get("checks") is None or (isinstance(row["checks"], list)
                                             and all(isinstance(c, dict) and isinstance(c.get("text"), str)
                                                     for c in row["checks"])),
              path, f"{where}.checks", "must be a list of mappings, each with a text")
        for c in row.get("checks") or []:
            _need("secondary" not in c or (isinstance(c["secondary"], dict) and "direction" in c["secondary"]),
                  path, f"{where}.checks", f"{c['text']!r}: secondary must be a test (a mapping with a direction)")
        figures = row.get("figures")
        _need(figures is None or (isinstance(figures, list) and all(
            isinstance(f, dict) and all(isinstance(f.get(k), str) for k in ("diagnosis", "file", "caption"))
            for f in figures)), path, f"{where}.figures", "must be a list of {diagnosis, file, caption} texts")
        for f in figures or []:
            _need((ROOT / f["diagnosis"] / f["file"]).is_file() and f["file"].endswith(".png"), path,
                  f"{where}.figures", f"names {f['diagnosis']}/{f['file']}, which is not a PNG file there")
        primary = row.get("primary")
        ok = (isinstance(primary, dict) and ("none" in primary or "direction" in primary)) or (
            isinstance(primary, list) and all(isinstance(t, dict) for t in primary))
        _need(primary is None or ok, path, f"{where}.primary", "must be a list of tests or {none: reason}")
    return d


def load_tasks(path) -> dict:
    """which_method.yaml, checked: `tasks` a list of mappings, each with its task, regime, store, methods and
    quality (and bias, when it has one)."""
    d = _yaml(path)
    _need(isinstance(d.get("tasks"), list) and d["tasks"], path, "tasks", "must be a non-empty list")
    for i, task in enumerate(d["tasks"]):
        where = f"tasks[{i}]"
        _need(isinstance(task, dict), path, where, "must be a mapping")
        for key in ("task", "regime", "store"):
            _need(isinstance(task.get(key), str) and task[key], path, f"{where}.{key}", "must be a text")
        _need(isinstance(task.get("methods"), dict) and task["methods"]
              and all(isinstance(v, str) for v in task["methods"].values()),
              path, f"{where}.methods", "must be a mapping method -> label")
        for key in ("quality", "bias", "also"):
            spec = task.get(key)
            if spec is None and key != "quality":
                continue
            _need(isinstance(spec, dict) and isinstance(spec.get("eval_set"), str) and isinstance(spec.get("label"), str)
                  and ("metric" in spec or "segment" in spec), path, f"{where}.{key}",
                  "must be a mapping with eval_set, label and a metric or segment")
    return d


def read_page(path) -> str:
    """A Markdown page, at most PAGE_LIMIT bytes of UTF-8 (a device or a stream is read only that far)."""
    try:
        raw = read_bytes(Path(path), "Markdown page", PAGE_LIMIT)
        return raw.decode("utf-8")
    except PosbiasError as e:
        raise InputError(str(e)) from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
