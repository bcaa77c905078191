"""Extractive question answering: readers (SQuAD, MRQA), sliding-window features, span heads,
vectorised decoding, the official SQuAD metrics, evaluation and answer-position analyses."""
from ..registry import TASKS
from . import answer_length, positions  # noqa: F401  (register the answer-length and -position segmenters)
from .task import QATask

TASKS.register("qa")(QATask())
