"""posbias.tagging.columns: a file's other columns, and the reader's error for a declared entity
scheme whose tag column holds none."""
import gzip
from pathlib import Path

import pytest

from posbias.errors import DataError
from posbias.tagging.columns import known_share, matching_column, other_columns
from posbias.tagging.readers import read_tagging

from helpers import cli_here

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tagging"
CONLL03 = str(FIXTURES / "conll03_style.txt")  # word POS chunk NER
UD = str(FIXTURES / "ud_style.conllu")


def test_other_columns_of_a_conll_file():
    cols = other_columns(read_tagging(CONLL03))  # word 0, tag -1 (= 3)
    assert [(c.option, c.value, c.name) for c in cols] == [("tag_column", 1, "the file's column 1"),
                                                           ("tag_column", 2, "the file's column 2")]
    assert cols[0].tags[:3] == ["NNP", "NNP", "VBD"] and cols[1].tags[:3] == ["B-NP", "I-NP", "B-VP"]
    assert len(cols[0].tags) == 17  # every word line, -DOCSTART- lines left out
    assert [c.value for c in other_columns(read_tagging(CONLL03, tag_column=1))] == [2, 3]


def test_other_columns_of_shards_and_of_conllu(tmp_path):
    gz = tmp_path / "b.txt.gz"
    gz.write_bytes(gzip.compress(Path(CONLL03).read_bytes()))
    both = read_tagging([CONLL03, str(gz)])
    assert [len(c.tags) for c in other_columns(both)] == [34, 34]
    assert [(c.option, c.value) for c in other_columns(read_tagging(UD))] == [("tag", "xpos")]
    assert other_columns(read_tagging(UD, tag="xpos"))[0].tags[:2] == ["PROPN", "AUX"]
    two = tmp_path / "two.conll"
    two.write_text("Ana B-PER\nsmiled O\n", encoding="utf-8")
    assert other_columns(read_tagging(str(two))) == []


def test_matching_column_uses_the_models_labels():
    ds = read_tagging(CONLL03)
    assert matching_column(ds, ["NNP", "NNPS", "NNS", "VBD", "IN", "JJ", "."], "none").value == 1
    assert matching_column(ds, ["O", "B-NP", "I-NP"], "iob2").value == 2  # NP: 9 of 12 chunk words
    assert matching_column(ds, ["O", "B-ADJP", "I-ADJP"], "iob2") is None  # no column has ADJP
    assert known_share(["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-PER", "I-PER"], "iob2") == pytest.approx(2 / 3)
    assert known_share(["B-person", "O"], ["O", "B-PER"], "iob2", {"person": "PER"}) == 1.0
    assert known_share(["NNP", "VBD"], ["O", "B-PER"], "iob2") == 0.0


def test_a_declared_entity_scheme_on_a_pos_column_names_the_entity_columns():
    with pytest.raises(DataError, match=r"the scheme was declared iob2, but its tag column \(1\) holds no entity "
                                        r"tag, only per-word tags \(NNP, VBD, \., IN, \.\.\.\); the file's column 2 "
                                        r"\(B-NP, .*\) and column 3 \(I-PER, .*\) hold entity tags: set "
                                        r"data\.tag_column=N to one of them \(columns count from 0\)$"):
        read_tagging(CONLL03, tag_column=1, scheme="iob2")
    # Under skip too: the column is wrong, not its sentences.
    with pytest.raises(DataError, match="holds no entity tag"):
        read_tagging(CONLL03, tag_column=1, scheme="iob2", on_bad_record="skip")


def test_a_declared_entity_scheme_with_one_entity_column_or_none(tmp_path):
    f = tmp_path / "ner_pos.conll"  # NER in the middle, POS last
    f.write_text("Ana B-PER NNP\nsmiled O VBD\n\nBo B-PER NNP\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"the file's column 1 \(B-PER\) holds entity tags: set data\.tag_column=1 "):
        read_tagging(str(f), scheme="iob2")
    g = tmp_path / "pos.conll"
    g.write_text("Ana NNP\nsmiled VBD\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"read them as per-word labels with data\.scheme none$"):
        read_tagging(str(g), scheme="bioes")


@pytest.mark.parametrize("kw", [dict(scheme="iob1"), dict(scheme="auto"), dict(tag_column=1, scheme="none"),
                                dict(tag_column=2, scheme="iob2"), dict(tag_column=1)])
def test_files_read_right_are_not_refused(kw):
    read_tagging(CONLL03, **kw)


def test_bad_entity_tags_are_still_per_sentence_errors():
    """A column of entity tags with a bad one is the sentence's fault, as before."""
    with pytest.raises(DataError, match=r"record 'line 6': invalid entity tag 'Q-ORG'"):
        read_tagging(str(FIXTURES / "bad_tag.conll"), scheme="iob2")


def test_cli_names_its_own_flag():
    r = cli_here("data", "stats", "--data", CONLL03, "--tag-column", "1", "--scheme", "iob2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "set --tag-column N to one of them" in r.stderr and "data.tag_column" not in r.stderr
