"""Hugging Face `datasets` in posbias's readers: a `Dataset` (or a one-split `DatasetDict`) wherever
a data file is accepted in the Python API. Duck-typed, so `datasets` is imported only by the user.

Token classification: a column of word lists (`tokens`, `words`) and one of tag lists (`ner_tags`,
`tags`, `labels`, `upos`, `pos_tags`, `xpos`; `data.tags_column` picks another), tag names from the
column's `ClassLabel` when it has one. QA: SQuAD's columns (`id`, `question`, `context`, `answers`
with `text` and `answer_start` lists, optional `title`); an empty `answers` is unanswerable (v2).

This module tells Datasets apart and finds their columns; each task reads them into its own data
set (`posbias.tagging.readers.read_tagging_dataset`, `posbias.qa.readers.read_squad_dataset`).
"""
from __future__ import annotations

from .errors import ConfigError, did_you_mean

TOKEN_COLUMNS = ("tokens", "words")
TAG_COLUMNS = ("ner_tags", "tags", "labels", "upos", "pos_tags", "xpos")


def is_hf_dataset(obj) -> bool:
    """A `datasets.Dataset` or `DatasetDict` (duck-typed: column names and features)."""
    return hasattr(obj, "column_names") and hasattr(obj, "features") or is_dataset_dict(obj)


def is_dataset_dict(obj) -> bool:
    """A DatasetDict (or a plain dict of Datasets): it has column_names too, so test this first."""
    return (type(obj).__name__ in ("DatasetDict", "IterableDatasetDict")
            or isinstance(obj, dict) and bool(obj) and all(hasattr(v, "column_names") for v in obj.values()))


def one_split(obj, what: str = "data"):
    """The Dataset of `obj`: itself, or the only split of a DatasetDict (several: a named error)."""
    if is_dataset_dict(obj):
        splits = list(obj.keys())
        if len(splits) != 1:
            raise ConfigError(f"{what}: a DatasetDict with splits {splits}; pass one, e.g. ds[{splits[-1]!r}]")
        return obj[splits[0]]
    return obj


def dataset_name(ds) -> str:
    """A stable description of a Dataset for configs and run_info: name, split, rows, fingerprint."""
    info = getattr(ds, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None) or "in-memory"
    split = getattr(ds, "split", None)
    fp = getattr(ds, "_fingerprint", None)
    return f"datasets:{name}" + (f"[{split}]" if split else "") + f"({len(ds)} rows" + (f", {fp[:12]})" if fp else ")")


def column(ds, wanted, candidates, what) -> str:
    """The column `wanted`, else the first of `candidates` the Dataset has; a named error otherwise."""
    cols = list(ds.column_names)
    if wanted:
        if wanted not in cols:
            raise ConfigError(f"{dataset_name(ds)}: no column {wanted!r} ({what})"
                              + (did_you_mean(wanted, cols, quote=True) or f"; columns: {cols}"))
        return wanted
    found = next((c for c in candidates if c in cols), None)
    if found is None:
        raise ConfigError(f"{dataset_name(ds)}: no {what} column (one of {list(candidates)}); columns: {cols}"
                          + ("; set data.tags_column" if what == "tag" else ""))
    return found


def tag_lists(ds, column: str) -> list[str] | None:
    """Every tag of a column of tag lists, as names (a `Sequence(ClassLabel)` column's ids named), in
    row order; None for a column that does not hold tag names (numbers without names, text)."""
    names = getattr(getattr(ds.features[column], "feature", None), "names", None)
    out = []
    for value in ds[column]:
        if not isinstance(value, (list, tuple)):
            return None
        for t in value:
            if names and isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(names):
                out.append(names[t])
            elif isinstance(t, str):
                out.append(t)
            else:
                return None
    return out
