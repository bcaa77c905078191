"""The words of tag-column hints: a column's tags as examples, how a user sets the column, and the
hint for a file declared to hold entity tags whose tag column has none. Pure text helpers: the
readers (`conll.py`) word their errors with them, `columns.py` finds the column to offer."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .schemes import parse_tag

# How the user of a front sets what these hints suggest: config keys (the CLI's overrides, the API's
# `overrides`, YAML). `posbias.hf` passes PositionBiasCallback's arguments instead; the CLI rewrites
# the keys it has flags for (`--tag-column`).
CONFIG_FRONT = {"tag_column": "data.tag_column={}", "tag": "data.tag={}", "tags_column": "data.tags_column={}",
                "label_map": "data.label_map",
                "labels": "set id2label and label2id there to the tag names the model was trained with"}

@dataclass
class Column:
    """Another column of a file or dataset: its reader option (`tag_column` = 1, `tag` = "xpos",
    `tags_column` = "pos_tags") and value, its name in messages, and every tag in it in order."""

    option: str
    value: int | str
    name: str
    tags: list[str]


def _entity_types(tags: list[str]) -> list[str] | None:
    """The entity type of each non-O tag, or None when some tag is not an entity tag."""
    types = []
    for t in tags:
        if t == "O":
            continue
        try:
            types.append(parse_tag(t)[1])
        except ValueError:
            return None
    return types


def holds_entities(col: Column) -> bool:
    """Whether every tag of the column is an entity tag or O, and some is not O."""
    return bool(_entity_types(col.tags))


def examples(tags: list[str], limit: int = 4) -> str:
    """`B-PER, I-PER, B-LOC, B-ORG, ...`: the most frequent tags other than O (O when it is all)."""
    common = [t for t, _ in Counter(t for t in tags if t != "O").most_common(limit + 1)] or ["O"]
    return ", ".join(common[:limit]) + (", ..." if len(common) > limit else "")


def setting(col: Column, front: dict) -> str:
    """How the user sets the column: `data.tag_column=3 (columns count from 0)`, `data.tag=xpos`,
    in the front's words (`front["tag_column"]`, `front["tag"]`: format strings)."""
    return front[col.option].format(col.value) + (" (columns count from 0)" if col.option == "tag_column" else "")


def hint(col: Column, front: dict, what: str = "the model's tags") -> str:
    """`the file's column 3 (B-PER, I-PER, ...) holds the model's tags: set data.tag_column=3 (...)`."""
    return f"{col.name} ({examples(col.tags)}) holds {what}: set {setting(col, front)}"


def entity_hint(cols: list[Column], front: dict = CONFIG_FRONT) -> str:
    """For a file declared to hold entity tags whose tag column has none: the other columns that do
    (CoNLL-2003 has two, chunk and NER), or the way to read per-word labels."""
    found = [c for c in cols if holds_entities(c)]
    if len(found) == 1:
        return hint(found[0], front, "entity tags")
    if found:
        named = " and ".join(f"column {c.value} ({examples(c.tags)})" for c in found)
        return (f"the file's {named} hold entity tags: set {front['tag_column'].format('N')} to one of them "
                "(columns count from 0)")
    return "read them as per-word labels with data.scheme none"


def tags_kind(tags, scheme: str) -> str:
    """`entity tags (B-PER, I-PER, ...)` or `per-word tags (NOUN, VERB, ...)`, for messages."""
    return f"{'per-word' if scheme == 'none' else 'entity'} tags ({examples(list(tags))})"
