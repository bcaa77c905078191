"""Unlabeled questions for `posbias predict qa --data`: a JSONL file of question + context.

One JSON object per line (UTF-8, plain or gzip; blank lines are skipped):

    {"id": "q1", "question": "Who wrote the first program?", "context": "Ada Lovelace wrote ..."}

- `question`, `context`: non-empty strings (required).
- `id`: optional, a non-empty string unique in the file; without it the question is named
  `line-<n>`, n its line number (1-based). Predictions are keyed by this id.
- Any other key is kept as the question's metadata and otherwise ignored (an `answers` key too:
  this format is for prediction; evaluation reads SQuAD JSON or MRQA JSONL with answers).

A bad line raises `DataError` naming the file and the line (`q.jsonl: record 'line 3': ...`);
with `on_bad_record="skip"` it is dropped and listed in `QADataset.skipped` instead.
"""
from __future__ import annotations

import json

from ..errors import DataError
from ..records import check_on_bad_record, collect, duplicate, is_text, unicode_problem
from .examples import QADataset, QAExample

FORMAT = "questions"
KEYS = ("id", "question", "context")


def is_question_line(record) -> bool:
    """Whether a parsed first line is a question of this format (not an MRQA header or context line)."""
    return isinstance(record, dict) and "question" in record and "qas" not in record and "header" not in record


def parse_questions(path, text: str, on_bad_record: str = "error") -> QADataset:
    """The questions of a JSONL file already read from `path` (module docstring)."""
    check_on_bad_record(on_bad_record)
    path = str(path)
    examples, skipped = [], []
    seen: dict[str, tuple[str, str]] = {}
    for n, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON may hold U+2028
        if line.strip():
            collect([_question(path, line, n, seen)], on_bad_record, examples, skipped)
    if not examples and not skipped:
        raise DataError(path, None, "no question in the file (one JSON object per line: "
                                    '{"id": ..., "question": ..., "context": ...})')
    return QADataset(path, FORMAT, FORMAT, examples, skipped)


def _question(path: str, line: str, n: int, seen: dict) -> QAExample | DataError:
    where = f"line {n}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return DataError(path, where, f"not valid JSON: {e.msg} at column {e.colno}")
    except RecursionError:  # json recurses once per nesting level
        return DataError(path, where, "not valid JSON: arrays or objects nested too deeply")
    if not isinstance(record, dict):
        return DataError(path, where, 'must be a JSON object {"id": ..., "question": ..., "context": ...}')
    qid = record.get("id", f"line-{n}")
    if not (isinstance(qid, str) and qid):
        return DataError(path, where, f"id must be a non-empty string, got {qid!r}")
    for key in ("question", "context"):
        value = record.get(key)
        if not is_text(value):
            return DataError(path, where, f"{key} must be a non-empty string, got {value!r:.40}")
    for key in KEYS:
        if reason := unicode_problem(record.get(key, qid)):
            return DataError(path, where, f"{key} {reason}")
    if reason := duplicate(seen, qid, path):
        return DataError(path, where, reason)
    seen[qid] = (path, where)
    meta = {k: v for k, v in record.items() if k not in KEYS}
    return QAExample(qid, record["question"], record["context"], meta=meta)
