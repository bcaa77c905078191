"""EM/F1 by gold answer sentence (Ko et al., EMNLP 2020, "Look at the First Sentence": scores by the
index of the paragraph sentence that holds the answer; a model trained on first-sentence answers
only drops sharply on later sentences).

A question's sentence is that of its first gold answer's first character (`sentences.answer_sentence`);
buckets 1, 2, ..., last - 1 and "last+" (default 1, 2, 3, 4, 5+), "no answer" for SQuAD v2
unanswerable questions.
"""
from __future__ import annotations

from ..errors import ConfigError, did_you_mean
from ..registry import SEGMENTERS
from .examples import QAExample
from .sentences import DEFAULT_LAST, NO_ANSWER, answer_sentence as sentence_of, sentence_label

__all__ = ["DEFAULT_LAST", "NO_ANSWER", "answer_sentence", "answer_sentence_labels", "check_last"]

MAX_LAST = 9
"""Labels "1".."8", "9+" still sort in sentence order as plain strings (the report and
`posbias diagnose qa` sort segments so); with last = 10, "10+" would sort before "2"."""


def check_last(last, key: str = "last") -> int:
    """Validate the first sentence index of the open bucket: an integer in 2..MAX_LAST (1 would put
    every question in one bucket)."""
    if isinstance(last, bool) or not isinstance(last, int) or not 2 <= last <= MAX_LAST:
        raise ConfigError(f"{key} must be an integer in 2..{MAX_LAST} (buckets 1, .., last - 1, last+), "
                          f"got {last!r}")
    return last


def answer_sentence_labels(examples: list[QAExample], last: int = DEFAULT_LAST) -> dict[str, str]:
    """Question id -> sentence bucket of its first gold answer ("1" .. "last+", or "no answer")."""
    return {e.id: sentence_label(sentence_of(e), last) for e in examples}


@SEGMENTERS.register("answer_sentence")
def answer_sentence(examples, eval_dir, checkpoint, last=DEFAULT_LAST, **options):
    """Sentence of the paragraph holding the first gold answer (Ko et al. 2020); option `last`: the
    first index of the open bucket, default 5 -> 1, 2, 3, 4, 5+."""
    return answer_sentence_labels(examples, check_last(last))


def _check_options(options: dict, key: str) -> None:
    """Called by the experiment spec loader: errors name `segments[i].<option>`."""
    for k in options:
        if k != "last":
            raise ConfigError(f"{key}.{k}: unknown option of answer_sentence"
                              + (did_you_mean(k, ["last"], prefix=f"{key}.") or " (it takes last)"))
    check_last(options.get("last", DEFAULT_LAST), f"{key}.last")


answer_sentence.gold_only = True  # depends on the gold answers only: the same questions for every method
answer_sentence.needs_checkpoint = False  # text alone: an archive without checkpoints still gets its bootstrap
answer_sentence.check_options = _check_options
