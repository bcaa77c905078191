"""CoNLL column files: CoNLL-2003 (`word POS chunk NER`, `-DOCSTART-` lines), WNUT-17 (`word<TAB>tag`)
and any other layout through `word_column` / `tag_column`.

One word per line, its columns split on runs of spaces and tabs (only those: a tweet's no-break
space stays inside its word); a blank line, or one of spaces and tabs only (WNUT-17's training
file separates sentences with a lone tab), ends a sentence. Lines end at "\\n" (a trailing "\\r"
is dropped), never at the other characters `str.splitlines` would split on.

The sentence is the record: a line with too few columns, a column count other than the file's
usual (most common) one, or a tag that is invalid or not valid in the file's scheme raises
`DataError` naming the file and the line, or with `on_bad_record="skip"` drops the whole
sentence, listed in `skipped` as ("line N", reason). Two file-level exceptions under scheme auto
always raise, since no single sentence is to blame: a file that starts entities both with I- (IOB1)
and with B- after O (IOB2; typically IOB2 with a stray I-), settled by declaring the scheme; and a
file whose only entity-like tags have no type (`B-`, `I-`), which would otherwise pass for POS.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError
from ..records import check_on_bad_record, read_text
from .column_hints import Column, entity_hint, examples
from .examples import TaggingDataset, TaggingExample
from .schemes import ENTITY_SCHEMES, TagSequenceError, convert, detect_scheme, parse_tag, validate

SCHEMES = ("auto",) + ENTITY_SCHEMES + ("none",)
DOCSTART = "-DOCSTART-"
# Under scheme auto, one tag shaped like an entity tag (letter, "-", type; Q-ORG included, so a
# bad prefix is an error rather than a POS-like label) makes the file's tags entity tags.
_ENTITY_SHAPED = re.compile(r"[A-Za-z]-.")
# A prefix with no type (`B-`, `I-`): entity tags that lost their type, not per-word labels.
_UNTYPED = re.compile(r"[A-Za-z]-")


def _token_lines(text: str):
    """(line number, columns) per line, columns [] for a blank line."""
    for n, line in enumerate(text.split("\n"), start=1):
        cols = line.strip(" \t\r").replace("\t", " ").split(" ")
        if "" in cols:  # runs of separators, or a blank line
            cols = [c for c in cols if c]
        yield n, cols


def _is_docstart(cols: list[str], word_column: int) -> bool:
    return -len(cols) <= word_column < len(cols) and cols[word_column] == DOCSTART


@dataclass
class _Sentence:
    """A sentence being read: its lines' numbers and columns, then its words and tags."""

    doc: int
    lines: list[int] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    tags: list[str] | None = None


def read_conll(path, *, word_column: int = 0, tag_column: int | None = -1, scheme: str = "auto",
               on_bad_record: str = "error", docstart: bool = True) -> TaggingDataset:
    """Read a CoNLL column file (plain or gzip).

    Args:
        word_column: column of the word (negative counts from the end).
        tag_column: column of the tag (negative counts from the end: CoNLL-2003's NER tag is -1);
            None reads an unlabelled file (tags None).
        scheme: the file's tags. "iob1" (converted to IOB2), "iob2", "bioes": entity tags, every
            sentence validated in that scheme; "none": any per-word labels (POS); "auto": entity
            tags when any tag is shaped like one (or all are O), the scheme detected over the
            whole file, validated and IOB1 converted; otherwise "none".
        docstart: `-DOCSTART-` lines (in the word column) start a document and are not sentences;
            `meta["doc"]` counts documents from 0.
    """
    check_on_bad_record(on_bad_record)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if tag_column is not None and (word_column < 0) == (tag_column < 0) and word_column == tag_column:
        raise ValueError(f"word_column and tag_column are the same column ({word_column})")
    path = str(path)
    text = read_text(path)
    sentences = _split(text, word_column, docstart)
    _check_is_conll(path, text, sentences)
    ds = _read_sentences(path, sentences, word_column, tag_column, scheme, on_bad_record, "conll")
    ds.read_as = {"paths": [path], "word_column": word_column, "tag_column": tag_column}
    return ds


def word_rows(path, word_column: int = 0) -> tuple[int | None, list[list[str]]]:
    """(the file's usual column count, the columns of each word line of that count): every column
    of the file, for `posbias.tagging.columns` to look for tags in another one."""
    sentences = _split(read_text(str(path)), word_column, True)
    width = _usual_width(sentences)
    return width, [cols for s in sentences for cols in s.rows if len(cols) == width]


def read_word_tag_rows(name: str, rows, *, scheme: str = "auto", on_bad_record: str = "error") -> TaggingDataset:
    """Sentences given as (words, tags) pairs (e.g. the rows of a `datasets.Dataset`), checked and
    converted exactly as a CoNLL file's; errors and example ids name the row ("row 12")."""
    check_on_bad_record(on_bad_record)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    sentences = []
    for r, (words, tags) in enumerate(rows):
        if len(words) != len(tags):
            raise DataError(name, f"row {r}", f"{len(words)} words but {len(tags)} tags")
        if words:
            sentences.append(_Sentence(0, [r] * len(words), [[str(w), str(t)] for w, t in zip(words, tags)]))
    if not sentences:
        raise DataError(name, None, "no sentences (no row has words)")
    return _read_sentences(name, sentences, 0, 1, scheme, on_bad_record, "rows", unit="row")


def _read_sentences(path: str, sentences: list, word_column: int, tag_column, scheme: str, on_bad_record: str,
                    fmt: str, unit: str = "line") -> TaggingDataset:
    """The checks and scheme handling of `read_conll`, on split sentences; `unit` names a record."""
    width = _usual_width(sentences)
    bad: list[tuple[int, str, str]] = []  # (first line, record, reason) of each dropped sentence

    def keep(sentences: list[_Sentence], check) -> list[_Sentence]:
        """The sentences `check` accepts; the others raise, or are dropped under skip."""
        kept = []
        for s in sentences:
            try:
                check(s)
                kept.append(s)
            except DataError as e:
                if on_bad_record == "error":
                    raise
                bad.append((s.lines[0], str(e.record), e.reason))
        return kept

    fits = width is not None and _width_problem(width, word_column, tag_column) is None
    sentences = keep(sentences, lambda s: _columns(path, s, width, fits, word_column, tag_column, unit))
    source = None
    if tag_column is not None and scheme == "auto":
        tags = [t for s in sentences for t in s.tags]
        entity = any(_ENTITY_SHAPED.match(t) for t in tags) or (bool(tags) and all(t == "O" for t in tags))
        if not entity:
            _check_typed(path, sentences, unit)
        scheme = "auto" if entity else "none"
    if tag_column is not None and scheme in ENTITY_SCHEMES:
        _check_entity_column(path, sentences, scheme, width, word_column, tag_column, unit)
    if tag_column is not None and scheme != "none":
        sentences = keep(sentences, lambda s: _parse_tags(path, s, unit))
        source, hint = scheme, ""
        if scheme == "auto":
            source = detect_scheme(s.tags for s in sentences)
            hint = f" (scheme auto read this file as {source.upper()})"
            if source == "iob1":
                _check_not_mixed(path, sentences, unit)
        sentences = keep(sentences, lambda s: _validate(path, s, source, hint, unit))
    name = Path(path).name
    examples = []
    for s in sentences:
        tags = convert(s.tags, "iob1", "iob2") if source == "iob1" else s.tags
        examples.append(TaggingExample(f"{name}:{s.lines[0]}", s.words, tags, {unit: s.lines[0], "doc": s.doc}))
    out_scheme = "none" if source is None else "iob2" if source == "iob1" else source
    skipped = [(record, reason) for _, record, reason in sorted(bad)]  # file order
    return TaggingDataset(path, fmt, out_scheme, examples, skipped, source_scheme=source)


def _split(text: str, word_column: int, docstart: bool) -> list[_Sentence]:
    """The sentences of a file, blank lines and `-DOCSTART-` lines between them."""
    sentences, current, doc, started = [], None, 0, False
    for n, cols in _token_lines(text):
        if not cols or (docstart and _is_docstart(cols, word_column)):
            if current is not None:
                sentences.append(current)
                current = None
            if cols:  # -DOCSTART-: a new document, unless nothing came before it
                doc += 1 if started else 0
                started = True
            continue
        if current is None:
            current, started = _Sentence(doc), True
        current.lines.append(n)
        current.rows.append(cols)
    if current is not None:
        sentences.append(current)
    return sentences


# CoNLL-U, the widest layout read here, has 10 columns; a lone line with more is prose or JSON.
_MAX_LONE_LINE_COLUMNS = 10


def _check_is_conll(path, text: str, sentences: list[_Sentence]) -> None:
    """Refuse input that is not a CoNLL column file (one word per line) instead of reading its
    first "word" and last "tag": JSON or JSON lines (a QA file given as tagging data), a single line
    of many columns (a sentence of prose), or a file without any sentence."""
    if not sentences:
        raise DataError(path, None, "no sentences in the file (it is empty or holds only blank and "
                                    f"{DOCSTART} lines)")
    first = sentences[0].lines[0]
    head = text.split("\n", first)[first - 1].strip()
    if head[:1] in "{[":
        if _parses_as_json(head) or _parses_as_json(text):  # JSON lines, or a JSON document
            raise DataError(path, f"line {first}", "this is JSON (e.g. a SQuAD or MRQA file), not a CoNLL "
                                                   "column file with one word and its tag per line")
    rows = [cols for s in sentences for cols in s.rows]
    if len(rows) == 1 and len(rows[0]) > _MAX_LONE_LINE_COLUMNS:
        raise DataError(path, f"line {first}", f"the file's only line holds {len(rows[0])} columns: a CoNLL file "
                                               "has one word per line, with its tag in a column beside it")


def _parses_as_json(text: str) -> bool:
    try:
        json.loads(text)  # fails at once on a CoNLL line such as "{ O"
    except (ValueError, RecursionError):
        return False
    return True


def _usual_width(sentences: list[_Sentence]) -> int | None:
    """The file's column count: the most common one, so the odd line out is the one reported."""
    counts = Counter(len(cols) for s in sentences for cols in s.rows)
    return counts.most_common(1)[0][0] if counts else None


def _columns(path, s: _Sentence, width: int, usual_fits: bool, word_column: int, tag_column: int | None,
             unit: str = "line") -> None:
    """Set the sentence's words and tags (None when unlabelled); DataError at the first bad line.
    `usual_fits`: lines of the file's usual width have the columns asked for (checked once)."""
    s.words, s.tags = [], [] if tag_column is not None else None
    for n, cols in zip(s.lines, s.rows):
        if len(cols) != width or not usual_fits:
            raise DataError(path, f"{unit} {n}", _width_problem(len(cols), word_column, tag_column)
                            or f"{len(cols)} columns where the file's lines have {width}")
        s.words.append(cols[word_column])
        if s.tags is not None:
            s.tags.append(cols[tag_column])


def _width_problem(k: int, word_column: int, tag_column: int | None) -> str | None:
    """Why a line of k columns cannot give the word and tag asked for, or None."""
    wanted = {"word_column": word_column} | ({"tag_column": tag_column} if tag_column is not None else {})
    if any(not -k <= c < k for c in wanted.values()):
        return f"{k} column(s), too few for " + " and ".join(f"{key} {c}" for key, c in wanted.items())
    if tag_column is not None and word_column % k == tag_column % k:
        return (f"{k} column(s): word_column {word_column} and tag_column {tag_column} are the same column "
                "(a missing word or tag?)")
    return None


def _parse_tags(path, s: _Sentence, unit: str = "line") -> None:
    for n, tag in zip(s.lines, s.tags):
        try:
            parse_tag(tag)
        except ValueError as e:
            raise DataError(path, f"{unit} {n}", str(e)) from None


def _validate(path, s: _Sentence, scheme: str, hint: str, unit: str = "line") -> None:
    try:
        validate(s.tags, scheme)
    except TagSequenceError as e:
        raise DataError(path, f"{unit} {s.lines[e.index]}", f"not valid {scheme.upper()}{hint}: {e}") from None


def _check_typed(path, sentences: list[_Sentence], unit: str = "line") -> None:
    """Under scheme auto, a file whose only entity-shaped tags are bare prefixes (`B-`, `I-`: a
    conversion that dropped the types) would otherwise be read as per-word labels and scored by
    accuracy. No single sentence is to blame, so it always raises, naming the first such line."""
    for s in sentences:
        for n, tag in zip(s.lines, s.tags):
            if _UNTYPED.fullmatch(tag):
                raise DataError(path, f"{unit} {n}", f"entity tag {tag!r} has no type, and no tag in the file has one: "
                                                     f"give the entities a type (e.g. {tag}X), or read the tags as "
                                                     "per-word labels with data.scheme none")


def _check_entity_column(path, sentences: list[_Sentence], scheme: str, width: int | None, word_column: int,
                         tag_column: int, unit: str = "line") -> None:
    """A file declared to hold entity tags whose tag column has not one (POS tags, CoNLL-2003 read
    at column 1) is the wrong column, not a file of bad sentences: every sentence but the all-O ones
    would be dropped under skip. So it always raises, naming the columns that do hold entity tags."""
    tags = [t for s in sentences for t in s.tags]
    if not tags or any(t == "O" or _ENTITY_SHAPED.match(t) for t in tags):
        return
    others = []
    if width is not None and unit == "line":
        skip = {word_column % width, tag_column % width}
        others = [Column("tag_column", c, f"the file's column {c}", [cols[c] for s in sentences for cols in s.rows])
                  for c in range(width) if c not in skip]
    where = f"its tag column ({tag_column})" if unit == "line" else "its tags"
    raise DataError(path, None, f"the scheme was declared {scheme}, but {where} holds no entity tag, only per-word "
                                f"tags ({examples(tags)}); {entity_hint(others)}")


def _check_not_mixed(path, sentences: list[_Sentence], unit: str = "line") -> None:
    """A file auto-detected as IOB1 that also starts entities with B- after O mixes IOB1 and IOB2
    (typically IOB2 with a stray I-): no per-sentence skip can tell which, so it always raises."""
    for s in sentences:
        try:
            validate(s.tags, "iob1")
        except TagSequenceError as e:
            b_line, b_tag = s.lines[e.index], s.tags[e.index]
            break
    else:
        return
    i_line, i_tag = next((n, t) for s in sentences for n, t, starts in zip(s.lines, s.tags, _i_starts(s.tags))
                         if starts)
    raise DataError(path, f"{unit} {b_line}", f"{b_tag} starts an entity as IOB2 does, but {unit} {i_line} starts "
                                            f"one with {i_tag} as only IOB1 does: declare scheme iob1 or iob2")


def _i_starts(tags: list[str]) -> list[bool]:
    """Which tags are an I-X starting an entity (IOB1 style)."""
    out, prev = [], ("O", None)
    for tag in tags:
        p, t = parse_tag(tag)
        out.append(p == "I" and not (prev[0] in ("B", "I") and prev[1] == t))
        prev = (p, t)
    return out
