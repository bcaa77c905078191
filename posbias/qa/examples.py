"""The example types every reader produces and every later stage consumes (read-only)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    """One gold answer mention: its text and the character offset where it starts in the context."""

    text: str
    start: int

    @property
    def end(self) -> int:
        """Exclusive character end offset."""
        return self.start + len(self.text)


@dataclass
class QAExample:
    """One extractive QA question over one context.

    Attributes:
        id: question id, unique within a file.
        question: question text.
        context: context (passage) text.
        answers: gold answer mentions, each checked to sit at its offset; empty when unanswerable.
        is_impossible: SQuAD v2 unanswerable question.
        title: article title when the format has one.
        score_texts: texts the metric compares against; defaults to the answer texts (MRQA keeps
            its `answers` list here, which may hold texts without a located mention).
        meta: reader extras, e.g. SQuAD-train reconstruction's `answer_start_ambiguous`.
    """

    id: str
    question: str
    context: str
    answers: list[Answer] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""
    score_texts: list[str] | None = None
    meta: dict = field(default_factory=dict)

    def gold_texts(self) -> list[str]:
        """The gold answer texts the SQuAD metric takes the max over ([] = no answer)."""
        if self.score_texts is not None:
            return list(self.score_texts)
        return [a.text for a in self.answers]


@dataclass
class QADataset:
    """What a reader returns: the examples plus an account of what it skipped.

    Attributes:
        path: the file read.
        format: "squad" or "mrqa".
        version: "1.1", "2.0" or the file's own version string.
        examples: the valid examples, in file order.
        skipped: (record id, reason) for each record dropped under `on_bad_record: skip`.
    """

    path: str
    format: str
    version: str
    examples: list[QAExample]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def has_impossible(self) -> bool:
        return any(e.is_impossible for e in self.examples)

    @property
    def null_answers(self) -> bool:
        """Whether a model trained on this data should answer "no answer" (SQuAD v2; what
        `data.version: auto` reads): it has unanswerable questions and does not declare itself
        version 1. A file that says "1.1" but holds unanswerable questions is a v1 training set whose
        truncation cut some answers off (`posbias data build --keep-unanswerable`, Random Padding
        App. B.2): those questions train on [CLS] windows (`data.unanswerable_windows: cls`), and the
        model is still evaluated as v1."""
        return self.has_impossible and not str(self.version).startswith("1")

    def gold(self) -> dict[str, list[str]]:
        """Question id -> gold texts, the input of `posbias.metrics`."""
        return {e.id: e.gold_texts() for e in self.examples}
