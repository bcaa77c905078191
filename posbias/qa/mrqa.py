"""MRQA 2019 shared-task reader (JSONL, plain or gzip).

Line 1 is `{"header": {"dataset": ..., "split": ...}}`; every other line is one context with its
questions. Each `detected_answers` char span `[start, end_inclusive]` becomes one `Answer` whose
text is sliced from the context: MRQA's own detected text may differ in case or spacing, so the
slice, not that text, is what sits at the offset. The qa's `answers` list becomes `score_texts`
because the official MRQA evaluation scores against it. Token fields are ignored.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from ..errors import DataError
from ..records import check_on_bad_record, collect, duplicate, is_int, is_text, read_text
from .examples import Answer, QADataset, QAExample
from .records import blame_questions, context_problem, text_problem


def read_mrqa(path, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """Read an MRQA JSONL file; errors name the file, the line number and the qid."""
    check_on_bad_record(on_bad_record)
    return parse_mrqa(path, read_text(path), on_bad_record, check_offsets)


def parse_mrqa(path, text: str, on_bad_record: str = "error",
               check_offsets: bool = True) -> QADataset:
    """`read_mrqa` on text already read from `path` (lets `read_qa` sniff the format first)."""
    check_on_bad_record(on_bad_record)
    path = str(path)
    version, examples, skipped = None, [], []
    seen: dict[str, tuple[str, str]] = {}
    for n, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON may hold U+2028
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            # One line is one record, so a broken line is a bad record, not a broken file.
            collect([DataError(path, f"line {n}", f"not valid JSON: {e.msg} at column {e.colno}")],
                    on_bad_record, examples, skipped)
            continue
        except RecursionError:  # json recurses once per nesting level
            collect([DataError(path, f"line {n}", "not valid MRQA JSON: arrays or objects nested too deeply")],
                    on_bad_record, examples, skipped)
            continue
        if isinstance(record, dict) and "header" in record:
            header = record["header"]
            if version is None and isinstance(header, dict) and is_text(header.get("dataset")):
                version = header["dataset"]
            continue
        collect(_context(path, record, n, seen, check_offsets), on_bad_record, examples, skipped)
    return QADataset(path, "mrqa", version or "mrqa", examples, skipped)


def _context(path, record, n, seen, check_offsets) -> Iterator[QAExample | DataError]:
    where = f"line {n}"
    qas, reason = context_problem(record, "line")
    if reason:
        yield from blame_questions(path, qas, where, reason, id_key="qid")
        return
    meta = {"context_id": record["id"]} if "id" in record else {}
    for k, qa in enumerate(qas):
        try:
            yield _qa(path, qa, record["context"], n, f"{where} question {k}", meta, seen,
                      check_offsets)
        except DataError as e:
            yield e


def _qa(path, qa, context, n, where, meta, seen, check_offsets) -> QAExample:
    if not isinstance(qa, dict):
        raise DataError(path, where, "question must be a JSON object")
    qid = qa.get("qid")
    if not (isinstance(qid, str) and qid):
        raise DataError(path, where, f"qid must be a non-empty string, got {qid!r}")

    def bad(reason: str) -> DataError:
        return DataError(path, qid, f"line {n}: {reason}")

    if reason := duplicate(seen, qid, path):
        raise bad(reason)
    if not is_text(qa.get("question")):
        raise bad(f"question must be a non-empty string, got {qa.get('question')!r}")
    if reason := text_problem(qid, qa["question"]):
        raise DataError(path, qid.encode("utf-8", "backslashreplace").decode(), f"line {n}: {reason}")
    texts = qa.get("answers")
    if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
        raise bad(f"answers must be a non-empty list of strings, got {texts!r}")
    detected = qa.get("detected_answers")
    if not isinstance(detected, list):
        raise bad(f"detected_answers must be a list, got {detected!r}")
    answers = []
    for d in detected:
        spans = d.get("char_spans") if isinstance(d, dict) else None
        if not isinstance(spans, list):
            raise bad(f"detected answer must have a char_spans list, got {d!r}")
        answers += [_span(span, context, bad, check_offsets) for span in spans]
    if not answers:
        raise bad("no detected answer span")
    seen[qid] = (path, where)  # only a kept question claims its id
    # The qa's own "id" (the source dataset's) is kept; MRQA's *_tokens fields are not.
    extra = {"source_id": qa["id"]} if "id" in qa else {}
    return QAExample(qid, qa["question"], context, answers, score_texts=list(texts),
                     meta={**meta, **extra})


def _span(span, context: str, bad, check_offsets: bool) -> Answer:
    if not (isinstance(span, list) and len(span) == 2 and all(map(is_int, span))):
        raise bad(f"char span must be [start, end] ints, got {span!r}")
    start, end = span
    if check_offsets and not 0 <= start <= end < len(context):
        raise bad(f"char span {span} is outside the context (length {len(context)})")
    return Answer(context[start:end + 1], start)  # MRQA ends are inclusive
