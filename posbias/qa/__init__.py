"""Extractive question answering: readers (SQuAD, MRQA), sliding-window features, span heads,
vectorised decoding, the official SQuAD metrics, evaluation and answer-position analyses."""
from ..registry import TASKS
from . import answer_length, answer_sentence, bidaf, positions  # noqa: F401  (segmenters; the BiDAF encoder type)
from .task import QATask

TASKS.register("qa")(QATask())
