"""Reading QA data: the format-sniffing `read_qa` and `read_dataset` (paths, shards, bundled aliases)."""
from __future__ import annotations

import json

from ..config import resolve_path
from ..records import check_on_bad_record, read_text
from .examples import QADataset
from .mrqa import parse_mrqa
from .squad import parse_squad, read_squad_many


def read_qa(path, on_bad_record: str = "error", check_offsets: bool = True) -> QADataset:
    """Read SQuAD JSON or MRQA JSONL (either maybe gzipped), telling them apart by content."""
    check_on_bad_record(on_bad_record)
    text = read_text(path)
    first = text.lstrip().split("\n", 1)[0]  # first non-empty line, without splitting the whole file
    try:
        head = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        head = None  # pretty-printed SQuAD: its first line is a lone "{" (and parse_squad names other faults)
    # A whole JSON object on line one without "data" is an MRQA header or context line.
    if isinstance(head, dict) and "data" not in head:
        return parse_mrqa(path, text, on_bad_record, check_offsets)
    return parse_squad(path, text, on_bad_record, check_offsets)


def read_dataset(spec, on_bad_record: str = "error") -> QADataset:
    """A QA file (or a list of shards) by path or bundled alias (`demo:train`, `demo:dev`), or a
    `datasets.Dataset` with SQuAD's columns."""
    from ..hf_datasets import is_hf_dataset, read_squad_dataset

    if is_hf_dataset(spec):
        return read_squad_dataset(spec, on_bad_record=on_bad_record)
    if isinstance(spec, (list, tuple)):
        return read_squad_many([resolve_path(p) for p in spec], on_bad_record=on_bad_record)
    return read_qa(resolve_path(spec), on_bad_record=on_bad_record)
