"""CoNLL and CoNLL-U readers: good files, malformed ones (file and line named), `on_bad_record: skip`,
shards, and the official counts of the real data sets.

Every fixture sentence under tests/fixtures/tagging is invented (CoNLL-2003 and TweeBank text may
not be copied into the repository).
"""
import gzip
import shutil
from pathlib import Path

import pytest

from posbias.errors import DataError
from posbias.tagging.conll import read_conll
from posbias.tagging.conllu import read_conllu
from posbias.tagging.readers import read_tagging, sniff_format
from posbias.tagging.schemes import spans

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tagging"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def gzipped(src: Path, dst: Path) -> Path:
    dst.write_bytes(gzip.compress(src.read_bytes()))
    return dst


# ---- CoNLL
def test_conll2003_style_docstart_and_iob1_detected_and_converted():
    ds = read_tagging(FIXTURES / "conll03_style.txt")
    assert (ds.format, ds.scheme, ds.source_scheme) == ("conll", "iob2", "iob1")
    assert [e.words[:2] for e in ds.examples] == [["Mira", "Kovac"], ["Brightwater", "Mills"], ["Quelbian", "farmers"]]
    assert ds.examples[0].tags == ["B-PER", "I-PER", "O", "B-PER", "I-PER", "B-PER", "O", "B-LOC", "O"]
    assert ds.examples[1].tags == ["B-ORG", "I-ORG", "O", "O"]
    assert [e.id for e in ds.examples] == ["conll03_style.txt:3", "conll03_style.txt:13", "conll03_style.txt:20"]
    assert [(e.meta["line"], e.meta["doc"]) for e in ds.examples] == [(3, 0), (13, 0), (20, 1)]
    assert spans(ds.examples[0].tags, "iob2") == [("PER", 0, 2), ("PER", 3, 5), ("PER", 5, 6), ("LOC", 7, 8)]


def test_conll_other_columns_and_options():
    path = FIXTURES / "conll03_style.txt"
    pos = read_tagging(path, tag_column=1)  # the POS column under scheme auto: not entity tags
    assert pos.scheme == "none" and pos.source_scheme is None and pos.examples[0].tags[:3] == ["NNP", "NNP", "VBD"]
    chunks = read_tagging(path, tag_column=2, scheme="iob2")  # the chunk column is IOB2
    assert chunks.scheme == "iob2" and chunks.examples[0].tags[:3] == ["B-NP", "I-NP", "B-VP"]
    unlabelled = read_conll(path, tag_column=None)
    assert unlabelled.scheme == "none" and unlabelled.examples[0].tags is None and len(unlabelled.examples) == 3
    no_docs = read_conll(path, docstart=False)  # -DOCSTART- read as a one-word sentence
    assert no_docs.examples[0].words == ["-DOCSTART-"] and len(no_docs.examples) == 5
    with pytest.raises(DataError, match=r"conll03_style\.txt.*line 3.*not valid IOB2.*I-PER must follow"):
        read_tagging(path, scheme="iob2")  # declared, so validated: this is IOB1


def test_wnut_style_tabs_and_types_with_dashes(tmp_path):
    for path in (FIXTURES / "wnut_style.conll", gzipped(FIXTURES / "wnut_style.conll", tmp_path / "w.conll")):
        ds = read_tagging(path)
        assert (ds.scheme, ds.source_scheme) == ("iob2", "iob2") and len(ds.examples) == 3  # a lone tab separates
        assert spans(ds.examples[0].tags, "iob2") == [("creative-work", 2, 4)]
        assert ds.examples[1].words == ["new", "Zentop", "X2", "from", "Zentop"]
        assert [e.id for e in ds.examples] == [f"{path.name}:{n}" for n in (1, 7, 13)]


def test_crlf_bom_and_bioes(tmp_path):
    text = (FIXTURES / "wnut_style.conll").read_text()
    crlf = tmp_path / "crlf.conll"
    crlf.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    plain = read_tagging(FIXTURES / "wnut_style.conll")
    ds = read_tagging(crlf)
    assert [e.words for e in ds.examples] == [e.words for e in plain.examples]
    assert [e.tags for e in ds.examples] == [e.tags for e in plain.examples]
    bioes = tmp_path / "b.conll"
    bioes.write_text("Ana S-PER\nvisited O\nNew B-LOC\nYork E-LOC\n")
    assert read_tagging(bioes).scheme == "bioes" and read_tagging(bioes, scheme="bioes").examples[0].tags[0] == "S-PER"


def test_shards(tmp_path):
    a = FIXTURES / "wnut_style.conll"
    b = tmp_path / "more.conll"
    b.write_text("Oslo\tB-location\nrocks\tO\n")
    ds = read_tagging([a, str(b)])
    assert ds.path == f"{a}, {b}" and len(ds.examples) == 4 and ds.examples[-1].id == "more.conll:1"
    (tmp_path / "x").mkdir()
    same_name = shutil.copy(a, tmp_path / "x" / "wnut_style.conll")
    with pytest.raises(DataError, match=r"wnut_style\.conll.*line 1.*duplicate id.*distinct file names"):
        read_tagging([a, same_name])
    skipped = read_tagging([a, same_name], on_bad_record="skip")
    assert len(skipped.examples) == 3 and len(skipped.skipped) == 3 and skipped.skipped[0][0].startswith(str(same_name))
    pos = tmp_path / "pos.conll"
    pos.write_text("Oslo\tNNP\n")
    with pytest.raises(DataError, match=r"pos\.conll: none tags, but the shard .*wnut_style\.conll has iob2"):
        read_tagging([a, pos])
    with pytest.raises(DataError, match="conllu shard among conll"):
        read_tagging([a, FIXTURES / "ud_style.conllu"])


# ---- CoNLL-U
def test_conllu_comments_multiword_tokens_and_empty_nodes(tmp_path):
    path = FIXTURES / "ud_style.conllu"
    assert sniff_format(path) == "conllu"
    as_txt = shutil.copy(path, tmp_path / "ud.txt")
    assert sniff_format(as_txt) == "conllu"  # by its columns too
    assert sniff_format(FIXTURES / "conll03_style.txt") == sniff_format(FIXTURES / "wnut_style.conll") == "conll"
    ds = read_tagging(path)
    assert (ds.format, ds.scheme) == ("conllu", "none") and len(ds.examples) == 3
    s1 = ds.examples[0]
    assert s1.id == "inv-1" and s1.meta["text"] == "Lina won't go, Pam will."
    assert s1.words == ["Lina", "wo", "n't", "go", ",", "Pam", "will", "."]  # no empty node 7.1
    assert s1.tags == ["PROPN", "AUX", "PART", "VERB", "PUNCT", "PROPN", "AUX", "PUNCT"]
    assert s1.meta["multiword"] == {1: (2, "won't")} and s1.meta["line"] == 4
    assert ds.examples[1].id == "ud_style.conllu:16" and "multiword" not in ds.examples[1].meta
    assert ds.examples[2].id == "inv-3"
    xpos = read_tagging(path, tag="xpos")
    assert xpos.examples[0].tags == ["NNP", "MD", "RB", "VB", ",", "NNP", "MD", "."]
    gz = gzipped(path, tmp_path / "ud.conllu.gz")
    assert [e.words for e in read_tagging(gz).examples] == [e.words for e in ds.examples]
    crlf = tmp_path / "crlf.conllu"
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    same = [(e.id.replace("crlf", "ud_style"), e.words, e.tags, e.meta) for e in read_conllu(crlf).examples]
    assert same == [(e.id, e.words, e.tags, e.meta) for e in ds.examples]


# ---- malformed files: the error names the file and the line; skip drops just that sentence
@pytest.mark.parametrize("name, options, line, message, skipped, kept", [
    ("bad_tag.conll", {}, 6, "invalid entity tag 'Q-ORG'", ["line 6"], 2),
    ("bad_tag.conll", {"scheme": "iob2"}, 6, "invalid entity tag 'Q-ORG'", ["line 6"], 2),
    ("bad_tag.conll", {"scheme": "iob1"}, 6, "invalid entity tag 'Q-ORG'", ["line 1", "line 6"], 1),
    ("bad_tag.conll", {"scheme": "bioes"}, 6, "invalid entity tag 'Q-ORG'", ["line 1", "line 6"], 1),
    ("short_line.conll", {}, 5, "1 column.*same column", ["line 5"], 2),
    ("short_line.conll", {"tag_column": 3}, 5, "1 column.*too few for word_column 0 and tag_column 3",
     ["line 5"], 2),
    ("mixed_columns.conll", {}, 4, "3 columns where the file's lines have 4", ["line 4"], 2),
    ("bad_ids.conllu", {}, 6, "word ID 3 where 2 was expected", ["line 6", "line 9"], 2),
    ("missing_xpos.conllu", {"tag": "xpos"}, 6, "no XPOS for word 2", ["line 6"], 1),
])
def test_malformed_files(name, options, line, message, skipped, kept):
    path = FIXTURES / name
    with pytest.raises(DataError, match=rf"{name}: record 'line {line}': .*{message}"):
        read_tagging(path, **options)  # under iob1 / bioes, Q-ORG is parsed before sentence 1 is validated
    ds = read_tagging(path, on_bad_record="skip", **options)
    assert [r for r, _ in ds.skipped] == skipped and len(ds.examples) == kept


def test_bad_conllu_ids_each_named():
    ds = read_conllu(FIXTURES / "bad_ids.conllu", on_bad_record="skip")
    assert [e.id for e in ds.examples] == ["b-1", "b-4"]
    assert [r for r, _ in ds.skipped] == ["line 6", "line 9"] and "ID 'one' is not a word index" in ds.skipped[1][1]
    assert read_conllu(FIXTURES / "missing_xpos.conllu").examples[1].tags == ["VERB", "ADV"]  # upos is there


@pytest.mark.parametrize("text, line, message", [
    ("# sent_id = a\n1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n# sent_id = a\n1\tYo\tyo\tINTJ\tUH\t_\t0\troot\t_\t_\n",
     4, "sent_id 'a': duplicate id \\(first at line 1\\)"),
    ("1-2\tdunno\t_\t_\t_\t_\t_\t_\t_\t_\n1\tdun\tdo\tVERB\tVB\t_\t0\troot\t_\t_\n", 1,
     "a multiword token reaches word 2, the sentence has 1"),
    ("1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n# note\n", 2, "a comment line inside a sentence"),
    ("0\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n", 1, "ID '0' is not a word index"),
    ("1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\n", 1, "9 tab-separated columns, CoNLL-U has 10"),
])
def test_malformed_conllu_cases(tmp_path, text, line, message):
    path = tmp_path / "bad.conllu"
    path.write_text(text)
    with pytest.raises(DataError, match=rf"bad\.conllu: record 'line {line}': {message}"):
        read_conllu(path)


def test_auto_scheme_edge_cases(tmp_path):
    def conll(text):
        path = tmp_path / "t.conll"
        path.write_text(text)
        return path

    # IOB2 with one stray I- reads as neither IOB1 nor IOB2: a file-level error, even under skip.
    mixed = conll("Ana O\nBerg I-PER\n\nOslo B-LOC\n")
    for mode in ("error", "skip"):
        with pytest.raises(DataError, match=r"t\.conll: record 'line 4': B-LOC starts .* line 2 .* I-PER"):
            read_conll(mixed, on_bad_record=mode)
    ds = read_conll(mixed, scheme="iob2", on_bad_record="skip")  # declared: the stray sentence goes
    assert [e.words for e in ds.examples] == [["Oslo"]] and ds.skipped[0][0] == "line 2"
    assert read_conll(conll("Ana O\nsmiled O\n")).scheme == "iob2"  # all O: entity tags, no entities
    assert read_conll(conll("Ana NNP\nsmiled VBD\n")).scheme == "none"
    with pytest.raises(DataError, match=r"line 2': .*prefix 'Q'"):
        read_conll(conll("Ana O\nBerg Q-ORG\n"))  # shaped like an entity tag: never a POS label
    with pytest.raises(DataError, match=r"line 2': not valid BIOES \(scheme auto read this file as BIOES\).*B-LOC must be followed"):
        read_conll(conll("Ana S-PER\nNew B-LOC\nYork O\n"))
    with pytest.raises(DataError, match="no sentences in the file"):  # not a tag-scheme mismatch later
        read_conll(conll(""))


# ---- the real data sets: official counts (/work/shared/data/PROVENANCE.md; TweeBank train words: its
# README). The README's dev / test word counts (11,742 / 19,112) are not what the files hold: 11,759 /
# 19,095 (an awk count of integer-ID lines agrees; the sum is the same, 30,854), so they are not asserted.
REAL = [
    ("conll2003/train.txt.gz", 14041, 203621, 23499),
    ("conll2003/valid.txt", 3250, 51362, 5942),
    ("conll2003/test.txt", 3453, 46435, 5648),
    ("ud_english_ewt/en_ewt-ud-train.conllu.gz", 12544, 204577, None),
    ("ud_english_ewt/en_ewt-ud-dev.conllu.gz", 2001, 25147, None),
    ("ud_english_ewt/en_ewt-ud-test.conllu.gz", 2077, 25094, None),
    ("wnut17/wnut17train.conll", 3394, None, None),
    ("wnut17/emerging.dev.conll", 1009, None, None),
    ("wnut17/emerging.test.annotated", 1287, None, None),
    ("tweebank_v2/en-ud-tweet-train.conllu", 1639, 24753, None),
    ("tweebank_v2/en-ud-tweet-dev.conllu", 710, None, None),
    ("tweebank_v2/en-ud-tweet-test.conllu", 1201, None, None),
]


@pytest.mark.parametrize("rel, sentences, words, entities", REAL, ids=[r[0] for r in REAL])
def test_real_data_official_counts(rel, sentences, words, entities):
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    ds = read_tagging(path)
    assert len(ds.examples) == sentences and not ds.skipped
    assert len({e.id for e in ds.examples}) == sentences
    if words is not None:
        assert sum(len(e) for e in ds.examples) == words
    if entities is not None:
        assert ds.scheme == "iob2" and sum(len(spans(e.tags, ds.scheme)) for e in ds.examples) == entities
    if rel.startswith("conll2003/"):  # articles, one per -DOCSTART- (the CoNLL-2003 paper's table 1)
        articles = {"train": 946, "valid": 216, "test": 231}[Path(rel).name.split(".")[0]]
        assert len({e.meta["doc"] for e in ds.examples}) == articles
