"""CoNLL-U (Universal Dependencies: UD English EWT, TweeBank v2): words and their UPOS or XPOS tags.

Ten tab-separated columns (ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC); `#` lines are
comments (`# sent_id = ...` gives the sentence id, `# text = ...` is kept); a blank line ends a
sentence. As the UD guidelines define words: a multiword-token line (`1-2 don't`) is the surface
form of the syntactic words 1 and 2 that follow it, which carry the annotation, so the words are
kept and the range is recorded in `meta["multiword"]`; empty nodes (`3.1`, enhanced graphs only)
are not words and are skipped. A malformed sentence is a `DataError` naming the file and the line
(or, with `on_bad_record="skip"`, a skipped record).
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import DataError
from ..records import check_on_bad_record, duplicate, read_text
from .examples import TaggingDataset, TaggingExample

COLUMNS = {"upos": 3, "xpos": 4}
_RANGE = re.compile(r"^(\d+)-(\d+)$")
_EMPTY = re.compile(r"^\d+\.\d+$")


def read_conllu(path, *, tag: str = "upos", on_bad_record: str = "error") -> TaggingDataset:
    """Read a CoNLL-U file (plain or gzip); `tag` selects the UPOS or the XPOS column."""
    check_on_bad_record(on_bad_record)
    if tag not in COLUMNS:
        raise ValueError(f"tag must be upos or xpos, got {tag!r}")
    path = str(path)
    examples, skipped, seen = [], [], {}
    block, comments, start = [], [], None
    lines = read_text(path).splitlines()
    for n, line in enumerate(lines + [""], start=1):
        if line.strip():
            if start is None:
                start = n
            if line.startswith("#") and not block:
                comments.append(line)
            else:
                block.append((n, line))
            continue
        if block:
            try:
                examples.append(_sentence(path, block, comments, start, tag, seen))
            except DataError as e:
                if on_bad_record == "error":
                    raise
                skipped.append((str(e.record), e.reason))
        block, comments, start = [], [], None
    return TaggingDataset(path, "conllu", "none", examples, skipped)


def _sentence(path, block, comments, start, tag, seen) -> TaggingExample:
    meta = {"line": block[0][0]}
    sent_id = None
    for c in comments:
        key, sep, value = c[1:].partition("=")
        if sep and key.strip() == "sent_id":
            sent_id = value.strip()
        elif sep and key.strip() == "text":
            meta["text"] = value.strip()
    words, tags, multiword = [], [], {}
    pending = None  # (first, last, surface) of a multiword token awaiting its words
    for n, line in block:
        cols = line.split("\t")
        if len(cols) != 10:
            raise DataError(path, f"line {n}", f"{len(cols)} tab-separated columns, CoNLL-U has 10")
        idx = cols[0]
        if _EMPTY.match(idx):
            continue  # an empty node of the enhanced graph: not a word
        if m := _RANGE.match(idx):
            first, last = int(m.group(1)), int(m.group(2))
            if first != len(words) + 1 or last < first:
                raise DataError(path, f"line {n}", f"multiword token range {idx} does not start at word "
                                                   f"{len(words) + 1}")
            pending = (first, last, cols[1])
            continue
        if not idx.isdigit():
            raise DataError(path, f"line {n}", f"ID {idx!r} is not a word index, a range or an empty node")
        if int(idx) != len(words) + 1:
            raise DataError(path, f"line {n}", f"word ID {idx} where {len(words) + 1} was expected")
        value = cols[COLUMNS[tag]]
        if value in ("", "_"):
            raise DataError(path, f"line {n}", f"no {tag.upper()} tag ({value!r}) for word {idx}")
        if not cols[1]:
            raise DataError(path, f"line {n}", f"empty FORM for word {idx}")
        words.append(cols[1])
        tags.append(value)
        if pending is not None and int(idx) == pending[0]:
            multiword[pending[0] - 1] = (pending[1] - 1, pending[2])
            pending = None
    if not words:
        raise DataError(path, f"line {start}", "a sentence without words")
    if max((last for last, _ in multiword.values()), default=0) >= len(words):
        raise DataError(path, f"line {start}", "a multiword token range reaches past the sentence's last word")
    if multiword:
        meta["multiword"] = multiword
    if sent_id is None:
        sent_id = f"{Path(path).name}:{meta['line']}"
    elif reason := duplicate(seen, sent_id, path):
        raise DataError(path, f"line {start}", f"sent_id {sent_id!r}: {reason}")
    seen[sent_id] = (path, f"line {start}")
    return TaggingExample(sent_id, words, tags, meta)
