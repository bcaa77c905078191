"""CoNLL-U (Universal Dependencies: UD English EWT, TweeBank v2): words and their UPOS or XPOS tags.

Ten tab-separated columns, ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC; `#` lines before
a sentence are comments (`# sent_id = ...` is its id, `# text = ...` is kept in meta); a blank
line ends a sentence. The words are UD's syntactic words, which carry the annotation: a
multiword-token line (`1-2 don't`) only gives the surface form of the words 1 and 2 that follow
it, so it is recorded in `meta["multiword"]`, and an empty node (`3.1`, enhanced graphs only) is
not a word and is skipped.

The sentence is the record: a malformed one raises `DataError` naming the file and the line, or
with `on_bad_record="skip"` is dropped and listed in `skipped` as ("line N", reason).
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import DataError
from ..records import check_on_bad_record, duplicate, read_text
from .examples import TaggingDataset, TaggingExample

TAG_COLUMNS = {"upos": 3, "xpos": 4}
N_COLUMNS = 10
_WORD = re.compile(r"[1-9][0-9]*")
_RANGE = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)")
_EMPTY_NODE = re.compile(r"[0-9]+\.[1-9][0-9]*")


def read_conllu(path, *, tag: str = "upos", on_bad_record: str = "error") -> TaggingDataset:
    """Read a CoNLL-U file (plain or gzip); `tag` picks the UPOS or the XPOS column.

    A sentence's id is its `# sent_id` (unique in the file), else `<file name>:<line>` of its
    first token line (TweeBank v2 has `# tweet_id` comments only).
    """
    check_on_bad_record(on_bad_record)
    if tag not in TAG_COLUMNS:
        raise ValueError(f"tag must be one of {tuple(TAG_COLUMNS)}, got {tag!r}")
    path = str(path)
    examples, skipped, seen = [], [], {}
    for comments, tokens in _blocks(read_text(path)):
        try:
            examples.append(_sentence(path, comments, tokens, tag, seen))
        except DataError as e:
            if on_bad_record == "error":
                raise
            skipped.append((str(e.record), e.reason))
    if not examples and not skipped:
        raise DataError(path, None, "no sentences in the file (it is empty or holds only comments)")
    return TaggingDataset(path, "conllu", "none", examples, skipped, read_as={"paths": [path], "tag": tag})


def _blocks(text: str):
    """(comment lines, token lines) per sentence, each line as (line number, text)."""
    comments, tokens = [], []
    for n, line in enumerate(text.split("\n") + [""], start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            if comments or tokens:
                yield comments, tokens
            comments, tokens = [], []
        elif line.startswith("#") and not tokens:
            comments.append((n, line))
        else:
            tokens.append((n, line))  # a "#" line among tokens: reported by _sentence


def _sentence(path, comments, tokens, tag: str, seen: dict) -> TaggingExample:
    meta, sent_id = {}, None
    for n, line in comments:
        key, sep, value = line[1:].partition("=")
        key, value = key.strip(), value.strip()
        if sep and key == "sent_id":
            if sent_id is not None:
                raise DataError(path, f"line {n}", "a second sent_id for one sentence")
            if not value:
                raise DataError(path, f"line {n}", "empty sent_id")
            if reason := duplicate(seen, value, path):
                raise DataError(path, f"line {n}", f"sent_id {value!r}: {reason}")
            seen[value] = (path, f"line {n}")
            sent_id = value
        elif sep and key == "text":
            meta["text"] = value
    if not tokens:
        raise DataError(path, f"line {comments[-1][0]}", "comment lines not followed by a sentence")
    meta["line"] = tokens[0][0]
    words, tags, multiword = [], [], {}
    covered = 0  # the last word a multiword token has claimed: ranges may not overlap
    for n, line in tokens:
        if line.startswith("#"):
            raise DataError(path, f"line {n}", "a comment line inside a sentence (comments go before it)")
        cols = line.split("\t")
        if len(cols) != N_COLUMNS:
            raise DataError(path, f"line {n}", f"{len(cols)} tab-separated columns, CoNLL-U has {N_COLUMNS}")
        idx, form = cols[0], cols[1]
        if _EMPTY_NODE.fullmatch(idx):
            continue  # an empty node of the enhanced graph: not a word
        if m := _RANGE.fullmatch(idx):
            first, last = int(m.group(1)), int(m.group(2))
            if first != len(words) + 1 or last <= first or first <= covered:
                raise DataError(path, f"line {n}", f"multiword token {idx} must span two or more words "
                                                   f"starting at the next word, {len(words) + 1}")
            multiword[first - 1] = (last - 1, form)
            covered = last
            continue
        if not _WORD.fullmatch(idx):
            raise DataError(path, f"line {n}", f"ID {idx!r} is not a word index, a range or an empty node")
        if int(idx) != len(words) + 1:
            raise DataError(path, f"line {n}", f"word ID {idx} where {len(words) + 1} was expected "
                                               "(IDs count 1, 2, ... in each sentence)")
        value = cols[TAG_COLUMNS[tag]]
        if value in ("", "_"):
            raise DataError(path, f"line {n}", f"no {tag.upper()} for word {idx} ({value!r}); "
                                               f"the file may not annotate {tag.upper()}")
        if not form:
            raise DataError(path, f"line {n}", f"empty FORM for word {idx}")
        words.append(form)
        tags.append(value)
    if not words:
        raise DataError(path, f"line {meta['line']}", "a sentence without words")
    if covered > len(words):
        raise DataError(path, f"line {meta['line']}", f"a multiword token reaches word {covered}, "
                                                      f"the sentence has {len(words)}")
    if multiword:
        meta["multiword"] = multiword
    sent_id = sent_id if sent_id is not None else f"{Path(path).name}:{meta['line']}"
    return TaggingExample(sent_id, words, tags, meta)
