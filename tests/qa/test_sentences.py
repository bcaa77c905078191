"""Answer sentences (posbias.qa.sentences): sentencex spans on hand-made paragraphs, buckets, QAExample."""
import pytest

from posbias.qa.examples import Answer, QAExample
from posbias.qa.sentences import (DEFAULT_LAST, NO_ANSWER, answer_sentence, sentence_index, sentence_label,
                                  sentence_spans, sentence_starts)

# Abbreviations (Dr., U.S., Jan., p.m.), decimals ($3.50, 2.5), initials and a quoted question.
PARAGRAPH = ('Dr. Smith moved to the U.S. in Jan. 1990 and paid $3.50 for a 2.5 kg bag. '
             'He left at 5 p.m. on Friday. '
             'J. R. R. Tolkien later wrote about it. '
             '"Was it worth it?" she asked. '
             'It was.')
SENTENCES = ['Dr. Smith moved to the U.S. in Jan. 1990 and paid $3.50 for a 2.5 kg bag. ',
             'He left at 5 p.m. on Friday. ',
             'J. R. R. Tolkien later wrote about it. ',
             '"Was it worth it?" she asked. ',
             'It was.']
OTHERS = {  # text -> its sentences
    'The price rose to $3.50. Prof. Jones disagreed. The U.S. Navy sailed at 9 a.m. sharp.':
        ['The price rose to $3.50. ', 'Prof. Jones disagreed. ', 'The U.S. Navy sailed at 9 a.m. sharp.'],
    'Washington, D.C. is the capital. It lies on the Potomac.':
        ['Washington, D.C. is the capital. ', 'It lies on the Potomac.'],
    "St. Mary's Church was built c. 1200 by Mr. Brown. Its spire, 40.5 m tall, fell in 1703! Why? Nobody knows.":
        ["St. Mary's Church was built c. 1200 by Mr. Brown. ", 'Its spire, 40.5 m tall, fell in 1703! ', 'Why? ',
         'Nobody knows.'],
    'He said "No." Then he went home.': ['He said "No." ', 'Then he went home.'],
}


def tiles(text, spans):
    return spans[0][0] == 0 and spans[-1][1] == len(text) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("text,expected", [(PARAGRAPH, SENTENCES), *OTHERS.items()])
def test_spans_tile_the_text_and_skip_abbreviations_decimals_initials(text, expected):
    spans = sentence_spans(text)
    assert tiles(text, spans)
    assert [text[a:b] for a, b in spans] == expected
    assert sentence_starts(text)[0] == 0 and list(sentence_starts(text)) == [a for a, _ in spans]


def test_paragraph_breaks_and_leading_whitespace_are_no_sentences():
    # sentencex reports "\n\n" as a boundary of its own: it must not count as a sentence.
    text = "\n\nHello there. Dr. Smith came.\n\nWorld here.\nNext line"
    spans = sentence_spans(text)
    assert tiles(text, spans)
    assert [text[a:b] for a, b in spans] == ["\n\nHello there. ", "Dr. Smith came.\n\n", "World here.\n", "Next line"]
    assert sentence_index(text, text.index("World")) == 3
    assert sentence_spans("") == [(0, 0)] and sentence_spans("   ") == [(0, 3)]


def test_sentence_index_of_chosen_characters():
    t = PARAGRAPH
    assert sentence_index(t, 0) == 1
    assert sentence_index(t, t.index("U.S.")) == 1          # not a boundary: abbreviation
    assert sentence_index(t, t.index("3.50")) == 1          # decimal
    assert sentence_index(t, t.index("Jan.") + 4) == 1      # the space after "Jan."
    assert sentence_index(t, t.index("He left")) == 2
    assert sentence_index(t, t.index("He left") - 1) == 1   # trailing space goes with the sentence before
    assert sentence_index(t, t.index("on Friday")) == 2     # after "p.m."
    assert sentence_index(t, t.index("Tolkien")) == 3       # initials
    assert sentence_index(t, t.index('"Was')) == 4          # an opening quote starts its sentence
    assert sentence_index(t, t.index("she asked")) == 4     # "?" inside the quote ends no sentence
    assert sentence_index(t, len(t) - 1) == 5
    naive = t[: t.index("Tolkien")].count(". ") + 1          # a split on ". " would say sentence 9
    assert naive != sentence_index(t, t.index("Tolkien"))


def test_sentence_label_buckets():
    assert [sentence_label(i) for i in (1, 2, 3, 4, 5, 6, 40)] == ["1", "2", "3", "4", "5+", "5+", "5+"]
    assert sentence_label(None) == NO_ANSWER and DEFAULT_LAST == 5
    assert [sentence_label(i, last=3) for i in (1, 2, 3, 9)] == ["1", "2", "3+", "3+"]


def test_answer_sentence_uses_the_first_gold_answer():
    t = PARAGRAPH
    e = QAExample("q", "Who wrote?", t, answers=[Answer("Tolkien", t.index("Tolkien")), Answer("Smith", 4)])
    assert answer_sentence(e) == 3  # the first answer, not the earliest
    e = QAExample("q", "When?", t, answers=[Answer("5 p.m.", t.index("5 p.m."))])
    assert answer_sentence(e) == 2
    assert answer_sentence(QAExample("n", "Who?", t, is_impossible=True)) is None
