"""Extractive question answering: readers (SQuAD, MRQA, unlabeled questions for prediction),
sliding-window features, span heads, vectorised decoding, the official SQuAD metrics, evaluation and
answer-position analyses."""
from ..registry import HEADS, SEGMENTERS, TASKS
from . import answer_length, answer_sentence  # noqa: F401  (segmenters)
from .task import QATask

# Registered when first asked for: these modules load torch, which reading and checking a config does
# without (the BiDAF encoder type registers itself with `posbias.qa.model`).
HEADS.load_on_use("posbias.qa.heads")
SEGMENTERS.load_on_use("posbias.qa.positions")
TASKS.register("qa")(QATask())
