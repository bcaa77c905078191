"""Extractive question answering: readers (SQuAD, MRQA), sliding-window features, span heads,
vectorised decoding, the official SQuAD metrics, evaluation and answer-position analyses."""
from ..registry import TASKS
from . import positions  # noqa: F401  (registers the answer-position segmenters)
from .task import QATask

TASKS.register("qa")(QATask())
