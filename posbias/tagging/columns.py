"""What an error about a file's tags says: which other column holds the tags a model knows ("the
file's column 1 (NNP, VBD, ...) holds the model's tags: set data.tag_column=1"), and the tags
themselves as the file writes them.

A CoNLL file's tag is its last column unless `data.tag_column` says otherwise, and CoNLL-2003 has
four (word POS chunk NER): a POS model pointed at it reads the NER column, and a file whose NER
tags are not last gives an NER model chunk tags. A CoNLL-U file's tags are UPOS unless `data.tag`
is xpos, so a Penn-Treebank tagger meets UPOS. The reader cannot tell such a mistake from a
deliberate choice; the model's label set can. These functions run only when an error about the
tags is already being raised (`posbias.tagging.evaluate.align_labels`, or a declared entity scheme
the tag column does not have), so a file that is right is never re-read and never gets a hint.
"""
from __future__ import annotations

from ..errors import DataError
from ..hf_datasets import tag_lists
from .conll import word_rows
from .conllu import read_conllu
from .examples import TaggingDataset
from .column_hints import (CONFIG_FRONT, Column, _entity_types, entity_hint, examples, hint,  # noqa: F401
                           holds_entities, setting, tags_kind)
from .schemes import convert, parse_tag

# A column is offered when at least this share of its tags (entity words for an entity model) are
# the model's: a file whose classes only partly match the model's still points at the right column.
MIN_SHARE = 0.5


def other_columns(dataset) -> list[Column]:
    """The columns of `dataset`'s file(s) other than its word and tag columns, read afresh
    (`dataset.read_as`; none for data that did not come from a file or whose shards differ)."""
    read_as = getattr(dataset, "read_as", None)
    if not read_as:
        return []
    if "dataset" in read_as:  # a datasets.Dataset: its other columns of tag lists (pos_tags, chunk_tags)
        ds = read_as["dataset"]
        cols = []
        for name in ds.column_names:
            if name not in (read_as["words_column"], read_as["tags_column"]):
                tags = tag_lists(ds, name)
                if tags:
                    cols.append(Column("tags_column", name, f"the dataset's column {name!r}", tags))
        return cols
    if "tag" in read_as:  # CoNLL-U: the other of UPOS and XPOS
        other = "xpos" if read_as["tag"] == "upos" else "upos"
        try:
            sets = [read_conllu(p, tag=other, on_bad_record="skip") for p in read_as["paths"]]
        except (DataError, ValueError):  # e.g. a file without XPOS
            return []
        tags = [t for ds in sets for e in ds.examples for t in e.tags]
        return [Column("tag", other, f"the file's {other.upper()} column", tags)] if tags else []
    if read_as.get("tag_column") is None:
        return []
    by_column: dict[int, list[str]] = {}
    width, word, tag = None, read_as["word_column"], read_as["tag_column"]
    for path in read_as["paths"]:
        try:
            w, rows = word_rows(path, word)
        except (DataError, OSError):
            return []
        if w is None or (width is not None and w != width) or not (-w <= word < w and -w <= tag < w):
            return []  # shards of different layouts: no column index names the same thing in all
        width = w
        for c in range(w):
            if c not in (word % w, tag % w):
                by_column.setdefault(c, []).extend(cols[c] for cols in rows)
    return [Column("tag_column", c, f"the file's column {c}", tags) for c, tags in sorted(by_column.items())]


def known_share(tags: list[str], labels: list[str], scheme: str, label_map: dict | None = None) -> float:
    """The share of `tags` a model with `labels` (in `scheme`) can predict, after `label_map`
    (data class -> the model's): entity words whose type the model knows (0 for per-word tags or O
    only), or per-word tags among its labels."""
    label_map = label_map or {}
    if scheme != "none":
        known = {parse_tag(t)[1] for t in labels if t != "O"}
        types = _entity_types(tags)
        return sum(str(label_map.get(t, t)) in known for t in types) / len(types) if types else 0.0
    known = set(labels)
    return sum(str(label_map.get(t, t)) in known for t in tags) / len(tags) if tags else 0.0


def matching_column(dataset, labels: list[str], scheme: str, label_map: dict | None = None) -> Column | None:
    """The other column of `dataset`'s file whose tags the model knows best (at least `MIN_SHARE`
    of them), or None."""
    best, best_share = None, MIN_SHARE
    for col in other_columns(dataset):
        share = known_share(col.tags, labels, scheme, label_map)
        if share >= best_share:
            best, best_share = col, share
    return best


def file_tags(dataset: TaggingDataset) -> list[str]:
    """Every gold tag as the file writes it (IOB2 for CoNLL-2003, not the BIOES `data.label_scheme`
    converted it to for a model), for messages the user checks against the file."""
    shown = dataset.file_scheme
    if dataset.scheme in ("none", shown):
        return [t for e in dataset.examples for t in e.tags or []]
    return [t for e in dataset.examples if e.tags for t in convert(e.tags, dataset.scheme, shown)]


def scheme_mismatch(dataset: TaggingDataset, labels: list[str], scheme: str) -> str:
    """Why a model of `scheme` cannot be scored on `dataset`: entity tags for a per-word model, or
    the reverse."""
    where = " in its tag column" if dataset.format == "conll" else ""
    return (f"{dataset.path} has {tags_kind(file_tags(dataset), dataset.scheme)}{where}, but the model predicts "
            f"{tags_kind(labels, scheme)}")
