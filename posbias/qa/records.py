"""Record validation shared by the SQuAD and MRQA readers: a context record and its questions."""
from __future__ import annotations

from ..errors import DataError
from ..records import is_text, unicode_problem


def blame_questions(path, qas, where: str, reason: str, id_key: str = "id") -> list[DataError]:
    """A bad context drops all its questions: one error each, named by id (else by position)."""
    qas = qas if isinstance(qas, list) else []
    ids = [q.get(id_key) if isinstance(q, dict) else None for q in qas]
    names = [i if isinstance(i, str) and i else f"{where} question {k}" for k, i in enumerate(ids)]
    if not names:  # no question to name: the context's position is the record
        return [DataError(path, where, reason)]
    return [DataError(path, name, f"{where}: {reason}") for name in names]


def context_problem(record, what: str) -> tuple[list | None, str | None]:
    """(its qas, why a context record {"context", "qas"} is unusable — or None when it is fine)."""
    qas = record.get("qas") if isinstance(record, dict) else None
    if not isinstance(record, dict):
        return qas, f"{what} must be a JSON object"
    if not is_text(record.get("context")):
        return qas, f"context must be a non-empty string, got {record.get('context')!r:.40}"
    if not isinstance(qas, list):
        return qas, "qas must be a list"
    if reason := unicode_problem(record["context"]):
        return qas, f"context {reason}"
    return qas, None


def text_problem(qid: str, question: str) -> str | None:
    """Why a question's id or text cannot be tokenized and written back (a lone surrogate), or None."""
    for name, value in (("id", qid), ("question", question)):
        if reason := unicode_problem(value):
            return f"{name} {reason}"
    return None
