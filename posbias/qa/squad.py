"""SQuAD v1.1 / v2.0 reader, the format-sniffing `read_qa`, and helpers the MRQA reader shares.

Every question is validated so later stages can trust each `Answer` to sit at its offset. A bad
record raises `DataError` naming the file and the question id (or its position when it has no id);
with `on_bad_record="skip"` it is dropped and listed in `QADataset.skipped` instead. File-level
problems (unreadable, corrupt gzip, bad UTF-8, not JSON, wrong top level) always raise.
No text is stripped: answer offsets index the context exactly as stored.
"""
from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from posbias.data.examples import Answer, QADataset, QAExample
from posbias.errors import DataError

ON_BAD_RECORD = ("error", "skip")
_GZIP_MAGIC = b"\x1f\x8b"
# Question keys the reader consumes; every other key (e.g. the rebuilt train set's
# `answer_start_ambiguous`) is kept in QAExample.meta. plausible_answers are ignored on purpose.
_QUESTION_KEYS = {"id", "question", "answers", "is_impossible", "plausible_answers"}


# --- helpers shared with mrqa.py ---------------------------------------------------------------

def check_on_bad_record(value: str) -> None:
    if value not in ON_BAD_RECORD:
        raise ValueError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {value!r}")


def read_text(path) -> str:
    """The file as text; gunzipped when it starts with the gzip magic bytes, whatever its suffix."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise DataError(path, None, f"cannot read file: {e.strerror or e}") from e
    gzipped = raw[:2] == _GZIP_MAGIC
    if gzipped:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(path, None, f"corrupt gzip data: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"byte {e.start}" + (" of the gunzipped data" if gzipped else "")
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(path, None, f"invalid UTF-8 at {where} (line {line})") from None
    return text.removeprefix("\ufeff")  # a BOM is not part of the JSON


def is_text(value) -> bool:
    """A string with a non-space character (checked only: the string itself is kept as is)."""
    return isinstance(value, str) and bool(value.strip())


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not an offset


def blame_questions(path, qas, where: str, reason: str, id_key: str = "id") -> list[DataError]:
    """A bad context drops all its questions: one error each, named by id (else by position)."""
    qas = qas if isinstance(qas, list) else []
    ids = [q.get(id_key) if isinstance(q, dict) else None for q in qas]
    names = [i if isinstance(i, str) and i else f"{where} question {k}" for k, i in enumerate(ids)]
    if not names:  # no question to name: the context's position is the record
        return [DataError(path, where, reason)]
    return [DataError(path, name, f"{where}: {reason}") for name in names]


def collect(items: Iterable[QAExample | DataError], on_bad_record: str,
            examples: list[QAExample], skipped: list[tuple[str, str]]) -> None:
    """Append each example; raise each error, or under `skip` record it as (record, reason)."""
    for item in items:
        if isinstance(item, QAExample):
            examples.append(item)
        elif on_bad_record == "error":
            raise item
        else:
            skipped.append((str(item.record), item.reason))


def context_problem(record, what: str) -> tuple[list | None, str | None]:
    """(its qas, why a context record {"context", "qas"} is unusable — or None when it is fine)."""
    qas = record.get("qas") if isinstance(record, dict) else None
    if not isinstance(record, dict):
        return qas, f"{what} must be a JSON object"
    if not is_text(record.get("context")):
        return qas, f"context must be a non-empty string, got {record.get('context')!r:.40}"
    if not isinstance(qas, list):
        return qas, "qas must be a list"
    return qas, None


def duplicate(seen: dict[str, tuple[str, str]], qid: str, path: str) -> str | None:
    """The reason a question id is a repeat, or None; `seen` maps id -> (path, where)."""
    if qid not in seen:
        return None
    first_path, first_where = seen[qid]
    elsewhere = f" of {first_path}" if first_path != path else ""
    return f"duplicate id (first at {first_where}{elsewhere})"


# --- public readers ----------------------------------------------------------------------------

def read_squad(path, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """Read a SQuAD v1.1 or v2.0 JSON file (plain or gzip)."""
    check_on_bad_record(on_bad_record)  # before reading: a typo should not cost a file read
    return _squad_dataset([(str(path), read_text(path))], on_bad_record, check_offsets)


def read_squad_many(paths, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """Read SQuAD shards as one dataset: their `data` lists in order, ids unique across all.

    The dataset's `path` is the shard paths joined with ", ".
    """
    check_on_bad_record(on_bad_record)
    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("read_squad_many needs at least one path")
    return _squad_dataset(((p, read_text(p)) for p in paths), on_bad_record, check_offsets)


def read_qa(path, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """Read SQuAD JSON or MRQA JSONL (either maybe gzipped), telling them apart by content."""
    from posbias.data.mrqa import parse_mrqa  # here, not at the top: mrqa imports this module

    check_on_bad_record(on_bad_record)
    text = read_text(path)
    first = text.lstrip().split("\n", 1)[0]  # first non-empty line, without splitting the whole file
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = None  # pretty-printed SQuAD: its first line is a lone "{"
    # A whole JSON object on line one without "data" is an MRQA header or context line.
    if isinstance(head, dict) and "data" not in head:
        return parse_mrqa(path, text, on_bad_record, check_offsets)
    return _squad_dataset([(str(path), text)], on_bad_record, check_offsets)


# --- SQuAD internals: one validator per record level -------------------------------------------

def _squad_dataset(sources: Iterable[tuple[str, str]], on_bad_record: str,
                   check_offsets: bool) -> QADataset:
    paths, versions, examples, skipped = [], [], [], []
    seen: dict[str, tuple[str, str]] = {}
    for path, text in sources:
        top = _load_json(path, text)
        if not (isinstance(top, dict) and isinstance(top.get("data"), list)):
            raise DataError(path, None, 'top level must be a JSON object with a "data" list')
        paths.append(path)
        versions.append(top.get("version"))
        items = (item for i, article in enumerate(top["data"])
                 for item in _article(path, article, i, seen, check_offsets))
        collect(items, on_bad_record, examples, skipped)
    if len(set(map(str, versions))) > 1:
        raise DataError(paths[-1], None, f"shards disagree on version: {versions}")
    version = versions[0]
    if version is None:  # unversioned exports: v2 is the one with unanswerable questions
        version = "2.0" if any(e.is_impossible for e in examples) else "1.1"
    version = "2.0" if "2.0" in str(version) else str(version)
    return QADataset(", ".join(paths), "squad", version, examples, skipped)


def _load_json(path: str, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        reason = f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        raise DataError(path, None, reason) from None


def _article(path, article, i, seen, check_offsets) -> Iterator[QAExample | DataError]:
    title = article.get("title", "") if isinstance(article, dict) else ""
    where = f"article {title!r}" if is_text(title) else f"article {i}"
    if not isinstance(article, dict):
        yield DataError(path, where, "article must be a JSON object")
    elif not isinstance(title, str):
        yield DataError(path, where, f"title must be a string, got {title!r}")
    elif not isinstance(article.get("paragraphs"), list):
        yield DataError(path, where, "paragraphs must be a list")
    else:
        for p, paragraph in enumerate(article["paragraphs"]):
            yield from _paragraph(path, paragraph, title, f"{where} paragraph {p}", seen,
                                  check_offsets)


def _paragraph(path, paragraph, title, where, seen,
               check_offsets) -> Iterator[QAExample | DataError]:
    qas, reason = context_problem(paragraph, "paragraph")
    if reason:
        yield from blame_questions(path, qas, where, reason)
        return
    for k, q in enumerate(qas):
        try:
            yield _question(path, q, paragraph["context"], title, f"{where} question {k}", seen,
                            check_offsets)
        except DataError as e:
            yield e


def _question(path, q, context, title, where, seen, check_offsets) -> QAExample:
    if not isinstance(q, dict):
        raise DataError(path, where, "question must be a JSON object")
    qid = q.get("id")
    if not (isinstance(qid, str) and qid):
        raise DataError(path, where, f"id must be a non-empty string, got {qid!r}")
    if reason := duplicate(seen, qid, path):
        raise DataError(path, qid, reason)
    if not is_text(q.get("question")):
        raise DataError(path, qid,
                        f"question must be a non-empty string, got {q.get('question')!r}")
    impossible = q.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise DataError(path, qid, f"is_impossible must be true or false, got {impossible!r}")
    answers = q.get("answers", [] if impossible else None)
    if not isinstance(answers, list):
        raise DataError(path, qid, f"answers must be a list, got {answers!r}")
    if impossible and answers:
        raise DataError(path, qid, "is_impossible question has answers (use plausible_answers)")
    if not impossible and not answers:
        raise DataError(path, qid, "answerable question has no answers")
    parsed = [_answer(path, qid, k, a, context, check_offsets) for k, a in enumerate(answers)]
    seen[qid] = (path, where)  # only a kept question claims its id
    meta = {key: value for key, value in q.items() if key not in _QUESTION_KEYS}
    return QAExample(qid, q["question"], context, parsed, impossible, title, meta=meta)


def _answer(path, qid, k, answer, context, check_offsets) -> Answer:
    if not isinstance(answer, dict):
        raise DataError(path, qid, f"answer {k} must be a JSON object")
    text, start = answer.get("text"), answer.get("answer_start")
    if not (isinstance(text, str) and text):
        raise DataError(path, qid, f"answer {k}: text must be a non-empty string, got {text!r}")
    if not (is_int(start) and 0 <= start < len(context)):
        raise DataError(path, qid, f"answer {k}: answer_start must be an int in "
                                   f"[0, {len(context)}), got {start!r}")
    found = context[start:start + len(text)]
    if check_offsets and found != text:
        raise DataError(path, qid, f"answer {k}: text {text!r} is not at answer_start {start} "
                                   f"(context there: {found!r})")
    return Answer(text, start)
