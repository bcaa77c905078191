"""Tag schemes: parsing, strict validation, detection, conversions, and spans equal to seqeval's
strict entities."""
import numpy as np
import pytest
from seqeval.scheme import IOB2, IOBES, Entities

from posbias.tagging.schemes import (TagSequenceError, bioes_to_iob2, convert, detect_scheme, iob1_to_iob2,
                                     iob2_to_bioes, parse_tag, spans, validate)


def test_parse_tag():
    assert parse_tag("O") == ("O", None)
    assert parse_tag("B-PER") == ("B", "PER") and parse_tag("S-LOC") == ("S", "LOC")
    assert parse_tag("I-creative-work") == ("I", "creative-work")  # WNUT-17: split on the first "-"


@pytest.mark.parametrize("tag", ["Q-ORG", "B-", "B", "b-PER", "PER", "O-PER", "", "-PER", "B- "])
def test_invalid_tags_raise_naming_the_tag(tag):
    with pytest.raises(ValueError, match=f"invalid entity tag {tag!r}"):
        parse_tag(tag)


def test_detect_scheme():
    assert detect_scheme([["O", "O"], []]) == "iob2"  # all O: every scheme reads it the same
    assert detect_scheme([["B-PER", "I-PER", "O", "B-LOC"]]) == "iob2"
    assert detect_scheme([["O"], ["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]) == "iob1"
    assert detect_scheme([["B-PER", "I-PER", "I-LOC"]]) == "iob1"  # I- after another type starts an entity
    assert detect_scheme([["I-PER"], ["B-X", "E-X"]]) == "bioes"  # E-/S- anywhere win
    assert detect_scheme([["O", "S-X"]]) == "bioes"
    with pytest.raises(ValueError, match="Q-ORG"):
        detect_scheme([["S-X"], ["Q-ORG"]])


@pytest.mark.parametrize("tags, scheme, index", [
    (["O", "I-PER"], "iob2", 1),
    (["B-PER", "I-LOC"], "iob2", 1),
    (["B-PER", "E-PER"], "iob2", 1),  # no E- in IOB2
    (["O", "B-PER"], "iob1", 1),  # IOB1's B- only after an entity of the same type
    (["I-LOC", "B-PER"], "iob1", 1),
    (["B-X", "O"], "bioes", 0),
    (["B-X", "S-X"], "bioes", 0),
    (["O", "I-X", "E-X"], "bioes", 1),
    (["B-X", "I-X", "O"], "bioes", 1),
    (["B-X", "I-Y", "E-Y"], "bioes", 0),
    (["O", "E-X"], "bioes", 1),
    (["S-X", "E-X"], "bioes", 1),
    (["O", "Q-ORG"], "iob2", 1),
])
def test_validate_names_index_and_tag(tags, scheme, index):
    with pytest.raises(TagSequenceError, match=rf"tag {index} {tags[index]!r}") as e:
        validate(tags, scheme)
    assert e.value.index == index and isinstance(e.value, ValueError)


@pytest.mark.parametrize("tags, scheme", [
    (["B-X", "I-X", "B-X", "O", "B-Y"], "iob2"),
    (["I-X", "I-X", "B-X", "O", "I-Y"], "iob1"),
    (["S-X", "B-X", "I-X", "E-X", "O", "S-Y", "S-Y"], "bioes"),
    ([], "bioes"),
    (["NN", "VB"], "none"),  # POS labels are not checked
])
def test_valid_sequences_pass(tags, scheme):
    validate(tags, scheme)


def test_conversions():
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert iob1_to_iob2(["I-PER", "I-LOC", "I-LOC"]) == ["B-PER", "B-LOC", "I-LOC"]
    assert iob2_to_bioes(["B-X", "I-X", "I-X", "O", "B-Y", "B-Y", "I-Y"]) == ["B-X", "I-X", "E-X", "O", "S-Y", "B-Y", "E-Y"]
    assert bioes_to_iob2(["S-X", "B-Y", "E-Y"]) == ["B-X", "B-Y", "I-Y"]
    assert convert(["I-A", "B-A", "O"], "iob1", "bioes") == ["S-A", "S-A", "O"]
    assert convert(["B-creative-work", "I-creative-work"], "iob2", "bioes") == ["B-creative-work", "E-creative-work"]
    with pytest.raises(ValueError, match="tag 1 'I-X'"):
        convert(["O", "I-X"], "iob2", "bioes")  # invalid input would invent an entity
    with pytest.raises(ValueError, match="iob1"):
        convert(["B-X"], "iob2", "iob1")


def random_iob2(rng, n: int) -> list[str]:
    """A valid IOB2 sequence of n tags: O runs and entities of 1-3 words, adjacent ones included."""
    tags = []
    while len(tags) < n:
        if rng.random() < 0.4:
            tags.append("O")
        else:
            kind = str(rng.choice(["PER", "LOC", "creative-work"]))
            tags += [f"B-{kind}"] + [f"I-{kind}"] * int(rng.integers(0, 3))
    return tags[:n]  # cutting inside an entity leaves it valid (shorter)


def to_iob1(iob2: list[str]) -> list[str]:
    """IOB1 of a valid IOB2 sequence: B- only where an entity directly follows one of its type."""
    out = []
    for i, tag in enumerate(iob2):
        p, t = parse_tag(tag)
        after_same = i > 0 and iob2[i - 1] != "O" and parse_tag(iob2[i - 1])[1] == t
        out.append(f"I-{t}" if p == "B" and not after_same else tag)
    return out


def test_round_trips_and_spans_equal_seqeval_strict():
    rng = np.random.default_rng(0)
    seqs = [random_iob2(rng, int(rng.integers(0, 25))) for _ in range(1000)]
    bioes = []
    for s in seqs:
        validate(s, "iob2")
        b = convert(s, "iob2", "bioes")
        validate(b, "bioes")
        assert convert(b, "bioes", "iob2") == s
        iob1 = to_iob1(s)
        validate(iob1, "iob1")
        assert convert(iob1, "iob1", "iob2") == s
        assert spans(b, "bioes") == spans(s, "iob2") == spans(iob1, "iob1")
        bioes.append(b)
    assert sum(len(spans(s, "iob2")) for s in seqs) > 1000  # the check below is not vacuous
    strict = [[(e.tag, e.start, e.end) for e in sent] for sent in Entities(seqs, IOB2).entities]
    assert [spans(s, "iob2") for s in seqs] == strict
    strict = [[(e.tag, e.start, e.end) for e in sent] for sent in Entities(bioes, IOBES).entities]
    assert [spans(s, "bioes") for s in bioes] == strict


def test_spans_reject_invalid_sequences():
    assert spans(["B-X", "I-X", "O", "B-Y", "B-Y"], "iob2") == [("X", 0, 2), ("Y", 3, 4), ("Y", 4, 5)]
    with pytest.raises(ValueError):
        spans(["O", "I-X"], "iob2")  # lenient seqeval would count an entity here, strict would not
    with pytest.raises(ValueError, match="entity scheme"):
        spans(["NN"], "none")
