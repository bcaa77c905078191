"""Training-label policies: which gold mention of an example becomes its span label.

A policy is a plain function `(example, rng) -> Answer | None`, registered by name so that answer
re-annotation (Random Padding paper, App. A) plugs in as another policy.
"""
from __future__ import annotations

import random

from .data.examples import Answer, QAExample
from .registry import LABEL_POLICIES


@LABEL_POLICIES.register("first")
def first_answer(example: QAExample, rng: random.Random) -> Answer | None:
    """The first gold answer, as the SQuAD training convention (and HF run_qa) uses."""
    return example.answers[0] if example.answers else None
