"""Sentence positions of answers (Ko et al., EMNLP 2020, "Look at the First Sentence": SQuAD-train^(k),
the questions whose answer lies in the k-th sentence of its paragraph, and scores by answer sentence).

Sentences come from `sentencex` (Wikimedia's rule-based segmenter: per-language abbreviation lists,
no model, no download; maintained). Its rule, in short: a sentence ends at a terminal punctuation
mark (. ! ? and their Unicode kin) followed by space, unless the word before the mark is a known
abbreviation (Dr., U.S., Jan., p.m.) or the mark sits inside a number (3.50) or an initialism;
quotes and brackets closing right after the mark stay with the sentence. Every context character
belongs to exactly one sentence: the spans tile the text, trailing spaces go with the sentence they
follow. `reproductions/first_sentence/sentence_agreement.py` measures its agreement with a second,
independent rule-based splitter (pySBD) on SQuAD dev.

A question's sentence is the one holding the first character of its *first* gold answer, as Ko et al.
build SQuAD-train^(k) from the (single) training answer; on dev, the first of the annotators' answers.
"""
from __future__ import annotations

import bisect
from functools import lru_cache

LANGUAGE = "en"
"""sentencex language code (SQuAD and MRQA are English)."""

NO_ANSWER = "no answer"
DEFAULT_LAST = 5
"""Sentence buckets 1, 2, ..., DEFAULT_LAST - 1 and "DEFAULT_LAST+" (the issue's 1, 2, 3, 4, 5+)."""


@lru_cache(maxsize=4096)
def sentence_starts(text: str) -> tuple[int, ...]:
    """Character offsets where the sentences of `text` begin; the first is always 0."""
    import sentencex

    starts = [0]
    for b in sentencex.get_sentence_boundaries(LANGUAGE, text):
        s = int(b["start_index"])
        # sentencex returns a paragraph break ("\n\n") as a boundary of its own, whitespace only: no
        # sentence, else every later index shifts by one; its whitespace stays with the sentence before
        # it, and whitespace opening the text with the first sentence.
        if s > starts[-1] and text[s:int(b["end_index"])].strip() and text[starts[-1]:s].strip():
            starts.append(s)
    return tuple(starts)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`; they tile it."""
    starts = sentence_starts(text)
    ends = starts[1:] + (len(text),)
    return list(zip(starts, ends))


def sentence_index(text: str, char: int) -> int:
    """1-based index of the sentence of `text` holding character `char`."""
    return bisect.bisect_right(sentence_starts(text), char)


def sentence_label(index: int | None, last: int = DEFAULT_LAST) -> str:
    """Bucket label of a 1-based sentence index: "1" .. "last-1", then "last+"; NO_ANSWER for None.

    Labels sort as plain strings in sentence order for last <= 9 (the report sorts segments so)."""
    if index is None:
        return NO_ANSWER
    return f"{last}+" if index >= last else str(index)


def answer_sentence(example) -> int | None:
    """1-based sentence of the first gold answer's first character, None without an answer."""
    if not example.answers:
        return None
    return sentence_index(example.context, example.answers[0].start)
