"""Reading QA data: the format-sniffing `read_qa` and `read_dataset` (paths, shards, bundled aliases).

Formats: SQuAD v1.1 / v2.0 JSON (`squad.py`), MRQA JSONL (`mrqa.py`) and, for prediction only
(`labeled=False`), a JSONL of unlabeled questions, one `{"id", "question", "context"}` object per
line (`questions.py`); SQuAD JSON whose questions have no answers is read for prediction too.
"""
from __future__ import annotations

import json

from ..config import resolve_path
from ..errors import DataError
from ..hf_datasets import column, dataset_name, is_hf_dataset, one_split
from ..records import check_on_bad_record, read_text
from .examples import QADataset
from .mrqa import parse_mrqa
from .questions import is_question_line, parse_questions
from .squad import parse_squad, read_squad_many, squad_from_object


def read_qa(path, on_bad_record: str = "error", check_offsets: bool = True, *, labeled: bool = True) -> QADataset:
    """Read SQuAD JSON or MRQA JSONL (either maybe gzipped), telling them apart by content.

    Args:
        labeled: False for prediction: SQuAD questions without answers are read as unlabeled (not
            "no answer") questions, and a JSONL of questions, one object per line,

                {"id": "q1", "question": "Who wrote it?", "context": "Ada Lovelace wrote ..."}

            (`id` optional: `line-<n>` by default; `posbias.qa.questions`) is read. True (evaluation,
            training): every answerable question needs its answers.
    """
    check_on_bad_record(on_bad_record)
    text = read_text(path)
    first = text.lstrip().split("\n", 1)[0]  # first non-empty line, without splitting the whole file
    try:
        head = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        head = None  # pretty-printed SQuAD: its first line is a lone "{" (and parse_squad names other faults)
    if is_question_line(head):
        if labeled:
            raise DataError(path, None, "a JSONL of questions without answers is for `posbias predict`; evaluation "
                                        "needs gold answers (SQuAD JSON or MRQA JSONL)")
        return parse_questions(path, text, on_bad_record)
    # A whole JSON object on line one without "data" is an MRQA header or context line.
    if isinstance(head, dict) and "data" not in head:
        return parse_mrqa(path, text, on_bad_record, check_offsets)
    return parse_squad(path, text, on_bad_record, check_offsets, labeled=labeled)


def read_dataset(spec, on_bad_record: str = "error", *, labeled: bool = True) -> QADataset:
    """A QA file (or a list of shards) by path or bundled alias (`demo:train`, `demo:dev`), or a
    `datasets.Dataset` with SQuAD's columns; `labeled=False` for prediction (`read_qa`)."""
    if is_hf_dataset(spec):
        return read_squad_dataset(spec, on_bad_record=on_bad_record)
    if isinstance(spec, (list, tuple)):
        return read_squad_many([resolve_path(p) for p in spec], on_bad_record=on_bad_record, labeled=labeled)
    return read_qa(resolve_path(spec), on_bad_record=on_bad_record, labeled=labeled)


def read_squad_dataset(ds, *, on_bad_record: str = "error"):
    """A posbias QADataset from a Dataset with SQuAD's columns, checked as a SQuAD file is."""
    ds = one_split(ds)
    for c in ("id", "question", "context", "answers"):
        column(ds, c, (c,), c)
    has_title = "title" in ds.column_names
    articles = []
    for r in ds:
        ans = r["answers"] or {}
        answers = [{"text": t, "answer_start": s} for t, s in zip(ans.get("text", []), ans.get("answer_start", []))]
        qa = {"id": str(r["id"]), "question": r["question"], "answers": answers}
        if not answers:
            qa["is_impossible"] = True
        articles.append({"title": r["title"] if has_title else "", "paragraphs": [{"context": r["context"], "qas": [qa]}]})
    return squad_from_object(dataset_name(ds), {"data": articles}, on_bad_record=on_bad_record)
