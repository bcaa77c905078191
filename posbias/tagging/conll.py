"""CoNLL column files: CoNLL-2003 (word POS chunk NER, `-DOCSTART-` lines), WNUT-17 (word TAB tag)
and any other layout by option (`word_column`, `tag_column`).

One word per line, columns split on whitespace; a blank (or whitespace-only: WNUT-17's training
file uses a lone tab) line ends a sentence. A sentence is the record: a short line, an inconsistent
column count or an invalid tag is a `DataError` naming the file and the line, or, with
`on_bad_record="skip"`, drops that sentence (listed in `skipped`).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from ..records import check_on_bad_record, read_text
from .examples import TaggingDataset, TaggingExample
from .schemes import convert, detect_scheme, parse_tag, validate


def _blocks(text: str):
    """(first line number, [(line number, columns)]) per sentence; `-DOCSTART-` lines as their own block."""
    block, start = [], None
    for n, line in enumerate(text.splitlines(), start=1):
        cols = line.split()
        if not cols:
            if block:
                yield start, block
            block, start = [], None
            continue
        if start is None:
            start = n
        block.append((n, cols))
    if block:
        yield start, block


def read_conll(path, *, word_column: int = 0, tag_column: int | None = -1, scheme: str = "auto",
               on_bad_record: str = "error", docstart: bool = True) -> TaggingDataset:
    """Read a CoNLL column file (plain or gzip).

    Args:
        tag_column: column of the tag (negative: from the end); None reads an unlabelled file.
        scheme: "iob1" (converted to IOB2), "iob2", "bioes" (validated), "none" (per-word labels such
            as POS: any tag), or "auto": entity tags when any tag looks like B-/I-/E-/S-X (then every
            tag must be one, and the scheme is detected over the file; IOB1 is converted), else none.
        docstart: treat `-DOCSTART-` lines as document boundaries (CoNLL-2003), not words.
    """
    check_on_bad_record(on_bad_record)
    if scheme not in ("auto", "iob1", "iob2", "bioes", "none"):
        raise ValueError(f"scheme must be auto, iob1, iob2, bioes or none, got {scheme!r}")
    path = str(path)
    name = Path(path).name
    sentences, skipped, doc, width = [], [], 0, None
    for start, block in _blocks(read_text(path)):
        first = block[0][1]
        if docstart and first[min(word_column, len(first) - 1)] == "-DOCSTART-":
            doc += 1
            continue
        try:
            words, tags, width = _sentence(path, block, word_column, tag_column, width)
        except DataError as e:
            if on_bad_record == "error":
                raise
            skipped.append((str(e.record), e.reason))
            continue
        sentences.append((TaggingExample(f"{name}:{start}", words, tags, {"line": start, "doc": doc}),
                          [n for n, _ in block]))
    source = None
    if tag_column is None:
        out_scheme = "none"
    else:
        if scheme == "auto":
            entity_like = any(_entity_like(t) for e, _ in sentences for t in e.tags)
            scheme = "auto" if entity_like else "none"
        if scheme != "none":
            kept = []
            for e, lines in sentences:
                try:
                    _check(path, lines, e.tags, None if scheme == "auto" else scheme)
                    kept.append((e, lines))
                except DataError as err:
                    if on_bad_record == "error":
                        raise
                    skipped.append((str(err.record), err.reason))
            sentences = kept
            source = detect_scheme(e.tags for e, _ in sentences) if scheme == "auto" else scheme
        out_scheme = "iob2" if source == "iob1" else (source or "none")
    examples = [e for e, _ in sentences]
    if source == "iob1":
        for e in examples:
            e.tags = convert(e.tags, "iob1", "iob2")
    return TaggingDataset(path, "conll", out_scheme, examples, skipped, source_scheme=source)


def _entity_like(tag: str) -> bool:
    return len(tag) > 2 and tag[1] == "-" and tag[0] in "BIES"


def _sentence(path, block, word_column, tag_column, width):
    words, tags = [], [] if tag_column is not None else None
    for n, cols in block:
        if width is None:
            width = len(cols)
        elif len(cols) != width:
            raise DataError(path, f"line {n}", f"{len(cols)} columns where the file's lines have {width}")
        need = max(word_column, tag_column if tag_column is not None and tag_column >= 0 else 0,
                   -tag_column - 1 if tag_column is not None and tag_column < 0 else 0) + 1
        if len(cols) < need:
            raise DataError(path, f"line {n}", f"{len(cols)} column(s), too few for word_column {word_column} "
                                               f"and tag_column {tag_column}")
        words.append(cols[word_column])
        if tags is not None:
            tags.append(cols[tag_column])
    return words, tags, width


def _check(path, lines, tags, scheme):
    """Every tag parses; with a declared scheme, the sequence is valid in it (DataError at its line)."""
    for n, tag in zip(lines, tags):
        try:
            parse_tag(tag)
        except ValueError as e:
            raise DataError(path, f"line {n}", str(e)) from None
    if scheme is not None:
        try:
            validate(tags, scheme)
        except ValueError as e:
            k = int(str(e).split()[1]) - 1  # "tag K (...)": the offending position
            raise DataError(path, f"line {lines[k]}", f"not valid {scheme.upper()}: {e}") from None
