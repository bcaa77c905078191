"""Training-label policies: which gold mention of an example becomes its span label.

A policy is a plain function `(example, rng) -> Answer | None`, registered by name so that answer
re-annotation (Random Padding paper, App. A) plugs in as another policy.
"""
from __future__ import annotations

import random

from .examples import Answer, QAExample
from ..registry import LABEL_POLICIES


@LABEL_POLICIES.register("first")
def first_answer(example: QAExample, rng: random.Random) -> Answer | None:
    """The first gold answer, as the SQuAD training convention (and HF run_qa) uses."""
    return example.answers[0] if example.answers else None


def occurrences(text: str, context: str) -> list[int]:
    """Every start offset of `text` in `context` (overlapping matches included)."""
    out, i = [], context.find(text)
    while i != -1:
        out.append(i)
        i = context.find(text, i + 1)
    return out


@LABEL_POLICIES.register("random_occurrence")
def random_occurrence(example: QAExample, rng: random.Random) -> Answer | None:
    """Answer re-annotation (Random Padding paper, App. A): when the first answer's text occurs
    several times in the context, one occurrence, drawn at random (seeded), becomes the label.

    Annotators' (and the rebuilt SQuAD train set's first-occurrence) offsets favour early mentions;
    drawing among all mentions spreads training answers over the context. For the rebuilt train set
    this also settles its `answer_start_ambiguous` questions without trusting their offsets.
    """
    if not example.answers:
        return None
    text = example.answers[0].text
    starts = occurrences(text, example.context)
    if len(starts) <= 1:
        return example.answers[0]
    return Answer(text, rng.choice(starts))
