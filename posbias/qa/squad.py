"""SQuAD v1.1 / v2.0 reader.

Every question is validated so later stages can trust each `Answer` to sit at its offset. A bad
record raises `DataError` naming the file and the question id (or its position when it has no id);
with `on_bad_record="skip"` it is dropped and listed in `QADataset.skipped` instead. File-level
problems (unreadable, corrupt gzip, bad UTF-8, not JSON, wrong top level) always raise.
No text is stripped: answer offsets index the context exactly as stored.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from ..errors import DataError
from ..records import check_on_bad_record, collect, duplicate, is_int, is_text, read_text
from .examples import Answer, QADataset, QAExample
from .records import blame_questions, context_problem, text_problem

# Question keys the reader consumes; every other key (e.g. the rebuilt train set's
# `answer_start_ambiguous`) is kept in QAExample.meta. plausible_answers are ignored on purpose.
_QUESTION_KEYS = {"id", "question", "answers", "is_impossible", "plausible_answers"}


# --- public readers ----------------------------------------------------------------------------

def read_squad(path, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """Read a SQuAD v1.1 or v2.0 JSON file (plain or gzip)."""
    check_on_bad_record(on_bad_record)  # before reading: a typo should not cost a file read
    return _squad_dataset([(str(path), read_text(path))], on_bad_record, check_offsets)


def parse_squad(path, text: str, on_bad_record: str = "error", check_offsets: bool = True, *,
                labeled: bool = True) -> QADataset:
    """`read_squad` on text already read from `path` (lets `read_qa` sniff the format first).
    `labeled=False` (prediction): a question without answers is read as an unlabeled question."""
    check_on_bad_record(on_bad_record)
    return _squad_dataset([(str(path), text)], on_bad_record, check_offsets, labeled)


def squad_from_object(name: str, top: dict, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """`read_squad` on an already parsed SQuAD object (e.g. built from a `datasets.Dataset`)."""
    check_on_bad_record(on_bad_record)
    return _squad_dataset([(name, top)], on_bad_record, check_offsets)


def read_squad_many(paths, on_bad_record: str = "error", check_offsets: bool = True, *,
                    labeled: bool = True) -> QADataset:
    """Read SQuAD shards as one dataset: their `data` lists in order, ids unique across all.

    The dataset's `path` is the shard paths joined with ", ".
    """
    check_on_bad_record(on_bad_record)
    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("read_squad_many needs at least one path")
    return _squad_dataset(((p, read_text(p)) for p in paths), on_bad_record, check_offsets, labeled)


# --- SQuAD internals: one validator per record level -------------------------------------------

def _squad_dataset(sources: Iterable[tuple[str, str]], on_bad_record: str,
                   check_offsets: bool, labeled: bool = True) -> QADataset:
    paths, versions, examples, skipped = [], [], [], []
    seen: dict[str, tuple[str, str]] = {}
    for path, text in sources:
        top = _load_json(path, text) if isinstance(text, str) else text  # text, or a parsed object
        if not (isinstance(top, dict) and isinstance(top.get("data"), list)):
            raise DataError(path, None, 'top level must be a JSON object with a "data" list')
        paths.append(path)
        versions.append(top.get("version"))
        items = (item for i, article in enumerate(top["data"])
                 for item in _article(path, article, i, seen, check_offsets, labeled))
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
    except RecursionError:  # json recurses once per nesting level
        raise DataError(path, None, "not valid SQuAD JSON: arrays or objects nested too deeply") from None


def _article(path, article, i, seen, check_offsets, labeled=True) -> Iterator[QAExample | DataError]:
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
                                  check_offsets, labeled)


def _paragraph(path, paragraph, title, where, seen,
               check_offsets, labeled=True) -> Iterator[QAExample | DataError]:
    qas, reason = context_problem(paragraph, "paragraph")
    if reason:
        yield from blame_questions(path, qas, where, reason)
        return
    for k, q in enumerate(qas):
        try:
            yield _question(path, q, paragraph["context"], title, f"{where} question {k}", seen,
                            check_offsets, labeled)
        except DataError as e:
            yield e


def _question(path, q, context, title, where, seen, check_offsets, labeled=True) -> QAExample:
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
    if reason := text_problem(qid, q["question"]):
        raise DataError(path, qid.encode("utf-8", "backslashreplace").decode(), reason)
    impossible = q.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise DataError(path, qid, f"is_impossible must be true or false, got {impossible!r}")
    # Unlabeled (prediction): a question may come without answers, or with an empty list.
    answers = q.get("answers", [] if impossible or not labeled else None)
    if not isinstance(answers, list):
        raise DataError(path, qid, f"answers must be a list, got {answers!r}")
    if impossible and answers:
        raise DataError(path, qid, "is_impossible question has answers (use plausible_answers)")
    if not impossible and not answers and labeled:
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
