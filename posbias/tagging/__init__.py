"""Token classification (NER, POS): readers (CoNLL, CoNLL-U), tag schemes, word-aligned windowed
features, a linear token head on any encoder, seqeval-strict / accuracy metrics and evaluation."""
from ..registry import TASKS
from .task import TaggingTask

TASKS.register("tagging")(TaggingTask())
