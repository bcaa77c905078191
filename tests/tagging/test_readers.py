"""CoNLL and CoNLL-U readers and tag schemes: good files, malformed ones (file and line named),
`on_bad_record: skip`, and the official counts of the real data sets."""
import gzip
from pathlib import Path

import numpy as np
import pytest
from seqeval.scheme import IOB2, IOBES, Entities

from posbias.errors import DataError
from posbias.tagging.readers import read_tagging, sniff_format
from posbias.tagging.schemes import convert, detect_scheme, parse_tag, spans, validate

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

# Invented sentences (CoNLL-2003 and TweeBank text may not be copied into the repository).
CONLL03 = """-DOCSTART- -X- -X- O

Anna NNP B-NP I-PER
Berg NNP I-NP I-PER
visited VBD B-VP O
Oslo NNP B-NP I-LOC
Bergen NNP I-NP B-LOC
. . O O

-DOCSTART- -X- -X- O

Fjord NNP B-NP I-ORG
Air NNP I-NP I-ORG
flies VBZ B-VP O
"""
WNUT = "Taylor\tB-person\nSwift\tI-person\nsings\tO\n\t\nthe\tO\nLast\tB-creative-work\nWaltz\tI-creative-work\n"
CONLLU = """# sent_id = s1
# text = I don't know.
1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tdo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
3.1\tknown\tknow\tVERB\tVBN\t_\t_\t_\t3:conj\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = s2
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def write(path: Path, text: str, gz: bool = False) -> Path:
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_conll2003_docstart_and_iob1(tmp_path):
    ds = read_tagging(write(tmp_path / "c.txt", CONLL03))
    assert ds.format == "conll" and ds.source_scheme == "iob1" and ds.scheme == "iob2"
    assert [e.words for e in ds.examples] == [["Anna", "Berg", "visited", "Oslo", "Bergen", "."],
                                              ["Fjord", "Air", "flies"]]
    assert ds.examples[0].tags == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "O"]
    assert ds.examples[1].tags == ["B-ORG", "I-ORG", "O"]
    assert [e.meta["doc"] for e in ds.examples] == [1, 2] and ds.examples[0].id == "c.txt:3"
    pos = read_tagging(tmp_path / "c.txt", tag_column=1)  # the POS column: not entity tags
    assert pos.scheme == "none" and pos.examples[0].tags[2] == "VBD"


def test_wnut_tabs_and_types_with_dashes(tmp_path):
    ds = read_tagging(write(tmp_path / "w.conll", WNUT, gz=True))
    assert ds.scheme == "iob2" and len(ds.examples) == 2  # a lone tab separates sentences
    assert spans(ds.examples[1].tags, "iob2") == [("creative-work", 1, 3)]


def test_crlf_and_shards(tmp_path):
    a = write(tmp_path / "a.conll", WNUT.replace("\n", "\r\n"))
    b = write(tmp_path / "b.conll", "Oslo\tB-location\n")
    ds = read_tagging([a, b])
    assert len(ds.examples) == 3 and ds.path == f"{a}, {b}" and ds.examples[0].words[0] == "Taylor"


def test_conllu_multiword_tokens_and_empty_nodes(tmp_path):
    path = write(tmp_path / "x.conllu", CONLLU)
    assert sniff_format(path) == "conllu"
    assert sniff_format(write(tmp_path / "x.txt", CONLLU)) == "conllu"  # by its columns too
    ds = read_tagging(path)
    s1 = ds.examples[0]
    assert s1.id == "s1" and s1.words == ["do", "n't", "know", "."] and s1.tags == ["AUX", "PART", "VERB", "PUNCT"]
    assert s1.meta["multiword"] == {0: (1, "don't")} and s1.meta["text"] == "I don't know."
    assert read_tagging(path, tag="xpos").examples[0].tags == ["VBP", "RB", "VB", "."]


@pytest.mark.parametrize("text, name, line, message", [
    ("Anna B-PER\nBerg Q-PER\n", "bad.conll", 2, "invalid entity tag 'Q-PER'"),
    ("Anna B-PER\nBerg\n", "bad.conll", 2, "columns"),
    ("Anna NNP B-PER\nBerg I-PER\n", "bad.conll", 2, "2 columns where"),
])
def test_malformed_conll_names_file_and_line(tmp_path, text, name, line, message):
    path = write(tmp_path / name, text)
    with pytest.raises(DataError, match=rf"{name}.*line {line}.*{message}"):
        read_tagging(path)


def test_declared_scheme_is_validated(tmp_path):
    path = write(tmp_path / "s.conll", "Anna O\nBerg I-PER\n\nOslo B-LOC\n")
    with pytest.raises(DataError, match=r"s\.conll.*line 2.*not valid IOB2"):
        read_tagging(path, scheme="iob2")
    assert read_tagging(path, scheme="auto").source_scheme == "iob1"  # auto: it is IOB1
    ds = read_tagging(path, scheme="iob2", on_bad_record="skip")
    assert len(ds.examples) == 1 and ds.skipped == [("line 2", ds.skipped[0][1])]


@pytest.mark.parametrize("text, line, message", [
    (CONLLU.replace("4\t.\t.\tPUNCT", "5\t.\t.\tPUNCT"), 8, "word ID 5 where 4"),
    (CONLLU.replace("1\tHi\thi\tINTJ\tUH", "1\tHi\thi\tINTJ\t_"), 11, "no XPOS tag"),
    (CONLLU.replace("3\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_", "3\tknow\tknow\tVERB"), 6, "4 tab-separated"),
    (CONLLU.replace("# sent_id = s2", "# sent_id = s1"), 10, "duplicate id"),
])
def test_malformed_conllu_names_file_and_line(tmp_path, text, line, message):
    path = write(tmp_path / "bad.conllu", text)
    with pytest.raises(DataError, match=rf"bad\.conllu.*line {line}.*{message}"):
        read_tagging(path, tag="xpos")
    ds = read_tagging(path, tag="xpos", on_bad_record="skip")
    assert len(ds.examples) == 1 and len(ds.skipped) == 1


# ---- schemes
def test_parse_and_invalid_tags():
    assert parse_tag("O") == ("O", None) and parse_tag("B-creative-work") == ("B", "creative-work")
    for bad in ("Q-ORG", "B-", "B", "b-PER", "PER"):
        with pytest.raises(ValueError, match="invalid entity tag"):
            parse_tag(bad)


def test_detect_and_convert():
    assert detect_scheme([["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]) == "iob1"
    assert convert(["I-PER", "I-PER", "B-PER", "O", "I-LOC"], "iob1", "iob2") == ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert detect_scheme([["B-X", "E-X"]]) == "bioes" and detect_scheme([["O"]]) == "iob2"
    assert convert(["B-X", "I-X", "O", "B-Y"], "iob2", "bioes") == ["B-X", "E-X", "O", "S-Y"]
    with pytest.raises(ValueError):
        validate(["B-X", "O", "E-X"], "bioes")


def random_iob2(rng, n):
    tags, i = [], 0
    while i < n:
        if rng.random() < 0.5:
            tags.append("O")
            i += 1
        else:
            k, t = int(min(rng.integers(1, 4), n - i)), str(rng.choice(["PER", "LOC", "creative-work"]))
            tags += [f"B-{t}"] + [f"I-{t}"] * (k - 1)
            i += k
    return tags


def test_round_trips_and_spans_equal_seqeval_strict():
    rng = np.random.default_rng(0)
    seqs = [random_iob2(rng, int(rng.integers(1, 20))) for _ in range(500)]
    for s in seqs:
        validate(s, "iob2")
        bioes = convert(s, "iob2", "bioes")
        validate(bioes, "bioes")
        assert convert(bioes, "bioes", "iob2") == s
        assert spans(bioes, "bioes") == spans(s, "iob2")
    ref = Entities(seqs, IOB2, suffix=False).entities
    assert [spans(s, "iob2") for s in seqs] == [[(e.tag, e.start, e.end) for e in r] for r in ref]
    bioes = [convert(s, "iob2", "bioes") for s in seqs]
    ref = Entities(bioes, IOBES, suffix=False).entities
    assert [spans(s, "bioes") for s in bioes] == [[(e.tag, e.start, e.end) for e in r] for r in ref]


# ---- the real data sets: official counts (PROVENANCE.md)
REAL = [
    ("conll2003/train.txt.gz", {}, 14041, 203621, 23499),
    ("conll2003/valid.txt", {}, 3250, 51362, 5942),
    ("conll2003/test.txt", {}, 3453, 46435, 5648),
    ("ud_english_ewt/en_ewt-ud-train.conllu.gz", {}, 12544, 204577, None),
    ("ud_english_ewt/en_ewt-ud-dev.conllu.gz", {}, 2001, 25147, None),
    ("ud_english_ewt/en_ewt-ud-test.conllu.gz", {}, 2077, 25094, None),
    ("wnut17/wnut17train.conll", {}, 3394, None, None),
    ("wnut17/emerging.dev.conll", {}, 1009, None, None),
    ("wnut17/emerging.test.annotated", {}, 1287, None, None),
    ("tweebank_v2/en-ud-tweet-train.conllu", {}, 1639, None, None),
    ("tweebank_v2/en-ud-tweet-dev.conllu", {}, 710, None, None),
    ("tweebank_v2/en-ud-tweet-test.conllu", {}, 1201, None, None),
]


@pytest.mark.parametrize("rel, kw, sentences, words, entities", REAL, ids=[r[0] for r in REAL])
def test_real_data_official_counts(rel, kw, sentences, words, entities):
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    ds = read_tagging(path, **kw)
    assert len(ds.examples) == sentences and not ds.skipped
    if words is not None:
        assert sum(len(e.words) for e in ds.examples) == words
    if entities is not None:
        assert sum(len(spans(e.tags, ds.scheme)) for e in ds.examples) == entities
