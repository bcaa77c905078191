"""The example types every tagging reader produces and every later stage consumes (read-only)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TaggingExample:
    """One sentence: its words and their gold tags.

    Attributes:
        id: unique within a dataset: the CoNLL-U `sent_id` when present, else `<file name>:<line>`
            of the sentence's first word line.
        words: the sentence's words (CoNLL-U: syntactic words, multiword-token ranges resolved).
        tags: one gold tag per word (IOB2 / BIOES entity tags, or POS tags); None when unlabelled.
        meta: reader extras: `line` (first word line, 1-based), `doc` (document index after
            `-DOCSTART-`), `text` (CoNLL-U `# text`), `multiword` ({first word index: (last, surface)}).
    """

    id: str
    words: list[str]
    tags: list[str] | None = None
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.words)


@dataclass
class TaggingDataset:
    """What a reader returns: the sentences plus an account of what it read and skipped.

    Attributes:
        path: the file read (several joined with ", ").
        format: "conll" or "conllu".
        scheme: the tag scheme of `examples[*].tags`: "iob2", "bioes" (entity tags, after any
            conversion) or "none" (POS and other per-word labels).
        source_scheme: the scheme found in the file before conversion (e.g. "iob1").
        examples: the valid sentences, in file order.
        skipped: (record, reason) for each sentence dropped under `on_bad_record: skip`.
        length_subset: when `data.length_quantiles` kept only D* (see `posbias.tagging.duplicated.
            length_subset`), its description: quantiles, length bounds, sentences before and after.
        read_as: where the reader took the tags from, so that an error about them can look at the
            file's other columns (`posbias.tagging.columns`): {"paths": [...], "word_column": ...,
            "tag_column": ...} (CoNLL), {"paths": [...], "tag": "upos"} (CoNLL-U), or {"dataset":
            the `datasets.Dataset`, "words_column": ..., "tags_column": ...}; None otherwise.
    """

    path: str
    format: str
    scheme: str
    examples: list[TaggingExample]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    source_scheme: str | None = None
    length_subset: dict | None = None
    read_as: dict | None = None

    @property
    def file_scheme(self) -> str:
        """The scheme of the file's own tags (IOB1 read as IOB2), whatever `data.label_scheme`
        converted `examples` to for a model: the scheme scores are comparable in."""
        if self.scheme == "none" or not self.source_scheme:
            return self.scheme
        found = {"iob2" if s.strip() == "iob1" else s.strip() for s in str(self.source_scheme).split(",")}
        return found.pop() if len(found) == 1 and found <= {"iob2", "bioes"} else self.scheme

    def tag_set(self) -> list[str]:
        """Sorted distinct gold tags."""
        return sorted({t for e in self.examples for t in (e.tags or [])})
