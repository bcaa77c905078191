"""Reading tagging data: `read_tagging` picks the format (CoNLL or CoNLL-U) and joins shards."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import DataError
from ..hf_datasets import TAG_COLUMNS, TOKEN_COLUMNS, column, dataset_name, one_split
from ..records import check_on_bad_record, duplicate, read_text
from .conll import read_conll, read_word_tag_rows
from .conllu import read_conllu
from .examples import TaggingDataset

FORMATS = ("auto", "conll", "conllu")
_CONLLU_ID = re.compile(r"[0-9]+([-.][0-9]+)?")  # a word, a multiword range or an empty node


def sniff_format(path) -> str:
    """`conllu` for a .conllu(.gz) name, or when the first line that is neither blank nor a `#`
    comment has 10 tab-separated columns and a CoNLL-U ID (`1`, `1-2`, `1.1`); else `conll`."""
    if Path(str(path)).name.lower().endswith((".conllu", ".conllu.gz")):
        return "conllu"
    for line in read_text(path).split("\n"):
        line = line.removesuffix("\r")
        if line.strip() and not line.startswith("#"):
            cols = line.split("\t")
            return "conllu" if len(cols) == 10 and _CONLLU_ID.fullmatch(cols[0]) else "conll"
    return "conll"


def read_tagging(spec, *, format: str = "auto", tag: str = "upos", word_column: int = 0,
                 tag_column: int | None = -1, scheme: str = "auto", on_bad_record: str = "error") -> TaggingDataset:
    """Read a CoNLL or CoNLL-U file, or a list of shards read as one data set.

    Args:
        spec: a path, or a list of paths whose sentences are concatenated in order.
        format: "conll", "conllu" or "auto" (`sniff_format`, per file).
        tag: CoNLL-U: "upos" or "xpos". word_column, tag_column, scheme: CoNLL (see `read_conll`).
        on_bad_record: "error" or "skip" (drop and list malformed sentences).

    Shards must agree on format and tag scheme, and sentence ids stay unique across them (a repeat
    is a bad record); the dataset's `path` joins the shard paths with ", " and, for several
    shards, each skipped record is prefixed with its shard's path.
    """
    check_on_bad_record(on_bad_record)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items or any(not isinstance(p, (str, os.PathLike)) for p in items):
        raise ValueError(f"read_tagging takes a path or a non-empty list of paths, got {spec!r}")
    paths = [str(p) for p in items]
    parts = []
    for p in paths:
        if (format if format != "auto" else sniff_format(p)) == "conllu":
            parts.append(read_conllu(p, tag=tag, on_bad_record=on_bad_record))
        else:
            parts.append(read_conll(p, word_column=word_column, tag_column=tag_column, scheme=scheme,
                                    on_bad_record=on_bad_record))
    if len(parts) == 1:
        return parts[0]
    return _join(parts, on_bad_record)


def _join(parts: list[TaggingDataset], on_bad_record: str) -> TaggingDataset:
    first = parts[0]
    for d in parts[1:]:
        if d.format != first.format:
            raise DataError(d.path, None, f"a {d.format} shard among {first.format} ones ({first.path})")
    voting = [d for d in parts if d.examples]  # an empty shard has no scheme to disagree with
    for d in voting[1:]:
        if d.scheme != voting[0].scheme:
            raise DataError(d.path, None, f"{d.scheme} tags, but the shard {voting[0].path} has {voting[0].scheme} "
                                          "tags (declare the scheme, or convert one shard)")
    examples, skipped, seen = [], [], {}
    for d in parts:
        skipped += [(f"{d.path}: {record}", reason) for record, reason in d.skipped]
        for e in d.examples:
            where = f"line {e.meta.get('line')}"
            if reason := duplicate(seen, e.id, d.path):
                if Path(seen[e.id][0]).name == Path(d.path).name and e.id.startswith(f"{Path(d.path).name}:"):
                    reason += "; ids are <file name>:<line>, so shards need distinct file names"
                error = DataError(d.path, where, f"sentence id {e.id!r}: {reason}")
                if on_bad_record == "error":
                    raise error
                skipped.append((f"{d.path}: {where}", error.reason))
                continue
            seen[e.id] = (d.path, where)
            examples.append(e)
    sources = [d.source_scheme for d in parts]
    source = sources[0] if len(set(sources)) == 1 else ", ".join(str(s) for s in sources)
    scheme = voting[0].scheme if voting else first.scheme
    read_as = None
    if all(d.read_as for d in parts):  # the same options for every shard: one file's, with every path
        read_as = {**first.read_as, "paths": [p for d in parts for p in d.read_as["paths"]]}
    return TaggingDataset(", ".join(d.path for d in parts), first.format, scheme, examples, skipped,
                          source_scheme=source, read_as=read_as)


def read_tagging_dataset(ds, *, tags_column: str | None = None, scheme: str = "auto", on_bad_record: str = "error"):
    """A posbias TaggingDataset from a Dataset of word lists and tag lists (names or ClassLabel ids)."""
    ds = one_split(ds)
    words = column(ds, None, TOKEN_COLUMNS, "word")
    tags = column(ds, tags_column, TAG_COLUMNS, "tag")
    names = getattr(getattr(ds.features[tags], "feature", None), "names", None)  # Sequence(ClassLabel)

    def rows():
        for r in ds:
            ts = r[tags]
            yield r[words], [names[t] for t in ts] if names else ts
    out = read_word_tag_rows(dataset_name(ds), rows(), scheme=scheme, on_bad_record=on_bad_record)
    out.read_as = {"dataset": ds, "words_column": words, "tags_column": tags}
    return out
