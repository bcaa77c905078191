"""Reading tagging data: `read_tagging` picks the format (CoNLL or CoNLL-U) and joins shards."""
from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from ..records import check_on_bad_record, read_text
from .conll import read_conll
from .conllu import read_conllu
from .examples import TaggingDataset


def sniff_format(path) -> str:
    """`conllu` for a .conllu(.gz) name or a first data line of 10 tab-separated columns whose first
    is a word index (`1`, `1-2`, `1.1`); else `conll`."""
    name = Path(str(path)).name
    if name.endswith((".conllu", ".conllu.gz")):
        return "conllu"
    for line in read_text(path).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        head = cols[0].replace("-", "").replace(".", "")
        return "conllu" if len(cols) == 10 and head.isdigit() else "conll"
    return "conll"


def read_tagging(spec, *, format: str = "auto", tag: str = "upos", word_column: int = 0, tag_column: int | None = -1,
                 scheme: str = "auto", on_bad_record: str = "error") -> TaggingDataset:
    """Read a CoNLL or CoNLL-U file, or a list of shards read as one data set (ids unique across
    them; `path` is the shard paths joined with ", ")."""
    check_on_bad_record(on_bad_record)
    paths = [str(p) for p in spec] if isinstance(spec, (list, tuple)) else [str(spec)]
    if not paths:
        raise ValueError("read_tagging needs at least one path")
    parts = []
    for p in paths:
        fmt = sniff_format(p) if format == "auto" else format
        if fmt == "conllu":
            parts.append(read_conllu(p, tag=tag, on_bad_record=on_bad_record))
        elif fmt == "conll":
            parts.append(read_conll(p, word_column=word_column, tag_column=tag_column, scheme=scheme,
                                    on_bad_record=on_bad_record))
        else:
            raise ValueError(f"format must be auto, conll or conllu, got {format!r}")
    if len(parts) == 1:
        return parts[0]
    schemes = {d.scheme for d in parts}
    if len(schemes) > 1:
        raise DataError(paths[-1], None, f"shards disagree on the tag scheme: {sorted(schemes)}")
    seen: dict[str, str] = {}
    for d in parts:
        for e in d.examples:
            if e.id in seen:
                raise DataError(d.path, e.id, f"duplicate sentence id (first in {seen[e.id]})")
            seen[e.id] = d.path
    return TaggingDataset(", ".join(paths), parts[0].format, parts[0].scheme,
                          [e for d in parts for e in d.examples], [s for d in parts for s in d.skipped],
                          source_scheme=parts[0].source_scheme)
