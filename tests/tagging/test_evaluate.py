"""posbias.tagging.evaluate: errors about a model's labels and a file's tags name the real cause
(label names left at transformers' LABEL_k, the file column that holds the model's tags)."""
import warnings
from pathlib import Path

import pytest
import torch

import posbias
from posbias.config import RESOURCES, build_config
from posbias.errors import ConfigError
from posbias.tagging.evaluate import align_labels
from posbias.tagging.model import generic_label_names, scheme_of_labels
from posbias.tagging.inputs import read_for

from helpers import SHARED_DATA, cli_here, run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tagging"
CONLL03 = str(FIXTURES / "conll03_style.txt")  # word POS chunk NER, IOB1
UD = str(FIXTURES / "ud_style.conllu")
WNUT = str(FIXTURES / "wnut_style.conll")  # word tag
NER = ["O"] + [f"{p}-{t}" for t in ("PER", "ORG", "LOC", "MISC") for p in "BI"]
PTB = [",", ".", "CD", "DT", "IN", "JJ", "MD", "NN", "NNP", "NNPS", "NNS", "RB", "UH", "VB", "VBD", "VBZ"]
CHUNK = ["O"] + [f"{p}-{t}" for t in ("NP", "VP", "PP", "ADJP") for p in "BI"]
UPOS = "ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ SYM VERB X".split()
GENERIC = [f"LABEL_{i}" for i in range(9)]


def read(path, *overrides):
    return read_for(path, build_config({"task": "tagging"}, list(overrides)))


def align(path, labels, *overrides, label_map=None):
    """align_labels of the file read with `overrides` for a model with `labels`; warnings are errors."""
    ds = read(path, *overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return align_labels(ds, labels, scheme_of_labels(labels), label_map, label_source="m/config.json")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny BertForTokenClassification folder saved without id2label (LABEL_0..LABEL_8)."""
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    out = tmp_path_factory.mktemp("generic")
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    torch.manual_seed(0)
    BertForTokenClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, num_labels=9)
                               ).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def test_generic_label_names():
    assert generic_label_names(GENERIC) and generic_label_names(["LABEL_0"])
    assert not generic_label_names(NER) and not generic_label_names([]) and not generic_label_names(["LABEL_0", "O"])


def test_generic_names_on_entity_data_name_config_json(hf_folder, tmp_path):
    """Not "has bioes tags but the model predicts none ones": the names are the problem."""
    for run in (lambda: posbias.evaluate(hf_folder, CONLL03, task="tagging", progress=False),
                lambda: posbias.diagnose(hf_folder, CONLL03, tmp_path / "d", task="tagging", progress=False)):
        with pytest.raises(ConfigError) as e:
            run()
        msg = str(e.value)
        assert msg.startswith(f"{hf_folder / 'config.json'}: the label names (id2label) are generic, LABEL_0..LABEL_8")
        assert "B-PER" in msg and "set id2label and label2id" in msg and "predicts" not in msg
        assert "label_map" not in msg  # an entity tag's prefix cannot be mapped onto a placeholder
    r = cli_here("evaluate", "tagging", "--model", str(hf_folder), "--data", CONLL03)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "LABEL_0..LABEL_8" in r.stderr and "config.json" in r.stderr


def test_generic_names_on_pos_data_offer_label_map(hf_folder):
    with pytest.raises(ConfigError, match=r"generic, LABEL_0\.\.LABEL_8 .*or map the data's tags onto them with "
                                          r"data\.label_map='\{ADV: LABEL_0, \.\.\.\}'"):
        posbias.evaluate(hf_folder, UD, task="tagging", progress=False)
    # Mapped onto the placeholders, the names match and the file is scored.
    tags = sorted({t for e in read(UD).examples for t in e.tags})
    mapping = ", ".join(f"{t}: LABEL_{i}" for i, t in enumerate(tags))
    res = posbias.evaluate(hf_folder, UD, task="tagging", progress=False, overrides=[f"data.label_map={{{mapping}}}"])
    assert res["words"] == sum(len(e.words) for e in read(UD).examples)


def test_predict_with_generic_names_warns(hf_folder):
    with pytest.warns(UserWarning, match=r"config\.json: the label names \(id2label\) are generic"):
        out = posbias.predict(hf_folder, text="Ana went to Oslo", task="tagging")
    assert set(out["text"]["tags"]) <= set(GENERIC)


@pytest.mark.parametrize("labels, overrides, column", [
    (PTB, [], "data.tag_column=1"),  # a POS model on CoNLL-2003's layout reads the NER column
    (CHUNK, [], "data.tag_column=2"),  # a chunker likewise
    (NER, ["data.tag_column=1"], "data.tag_column=3"),  # the NER model pointed at the POS column
    (NER, ["data.tag_column=2"], "data.tag_column=3"),  # ... or at the chunk column (entity-shaped)
    (CHUNK, ["data.tag_column=1"], "data.tag_column=2"),
])
def test_another_column_holding_the_models_tags_is_named(labels, overrides, column):
    with pytest.raises(ConfigError) as e:
        align(CONLL03, labels, *overrides)
    assert f"holds the model's tags: set {column} (columns count from 0)" in str(e.value)
    assert str(e.value).count("the file's column") == 1  # one column named


def test_the_other_conllu_tag_is_named():
    with pytest.raises(ConfigError, match=r"the file's XPOS column \(NNP, MD, .*\) holds the model's tags: set "
                                          r"data\.tag=xpos$"):
        align(UD, PTB)
    with pytest.raises(ConfigError, match=r"UPOS column .* set data\.tag=upos$"):
        align(UD, UPOS, "data.tag=xpos")


@pytest.mark.parametrize("path, labels, overrides", [
    (CONLL03, NER, []), (CONLL03, PTB, ["data.tag_column=1"]), (CONLL03, CHUNK, ["data.tag_column=2"]),
    (UD, UPOS, []), (UD, PTB, ["data.tag=xpos"]),
    (WNUT, ["O", "B-creative-work", "I-creative-work", "B-product", "I-product", "B-corporation", "I-corporation"], []),
])
def test_a_file_read_right_gets_no_error_and_no_warning(path, labels, overrides):
    align(path, labels, *overrides)


def test_no_column_to_offer_keeps_the_label_map_hint():
    """WNUT's two columns: nothing else to suggest; the names differ, so label_map it is."""
    with pytest.raises(ConfigError, match=r"the data's entity types \['corporation', 'creative-work', 'product'\] "
                                          r"are not among the model's .*; map them with data\.label_map") as e:
        align(WNUT, NER)
    assert "column" not in str(e.value)
    with pytest.raises(ConfigError, match=r"has per-word tags \(PROPN, AUX, .*\), but the model predicts entity "
                                          r"tags \(B-PER, I-PER, .*\)$"):
        align(UD, NER)  # neither UPOS nor XPOS holds entity tags


def test_a_mostly_foreign_column_is_an_error_when_another_fits():
    """A model that shares a tag or two with the wrong column (SYM, X) is not "a model trained
    without some rare classes": when another column fits, the error names it; when none does, the
    warning stays."""
    with pytest.raises(ConfigError, match=r"the model can predict only 18\.2% of the data's tags .*"
                                          r"set data\.tag=xpos"):
        align(UD, PTB + ["PUNCT"])  # 2 of the 11 UPOS words are PUNCT
    with pytest.warns(UserWarning, match="cannot predict the data's tags"):
        ds = read(UD)
        align_labels(ds, ["NOUN", "PUNCT"], "none", None)  # no other column fits either


def _shared(name):
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return str(path)


@pytest.mark.parametrize("name", ["conll2003/test.txt", "conll2003/valid.txt"])
def test_conll2003_read_right_has_no_false_alarm_and_a_wrong_column_is_named(name):
    path = _shared(name)
    ner = ["O"] + [f"{p}-{t}" for t in ("PER", "ORG", "LOC", "MISC") for p in "BIES"]
    align(path, ner)
    ptb = sorted({t for e in read(path, "data.tag_column=1").examples for t in e.tags})
    align(path, ptb, "data.tag_column=1")
    with pytest.raises(ConfigError, match=r"column 1 \(NN.*set data\.tag_column=1 \(columns count from 0\)$"):
        align(path, ptb)
    with pytest.raises(ConfigError, match=r"column 3 \(B-.*set data\.tag_column=3 \(columns count from 0\)$"):
        align(path, ner, "data.tag_column=2")


@pytest.mark.parametrize("name", ["wnut17/emerging.dev.conll", "wnut17/emerging.test.annotated"])
def test_wnut17_read_right_has_no_false_alarm(name):
    path = _shared(name)
    align(path, ["O"] + [f"{p}-{t}" for t in ("corporation", "creative-work", "group", "location", "person",
                                              "product") for p in "BI"])


@pytest.fixture(scope="module")
def named_folder(tmp_path_factory):
    """A tiny BertForTokenClassification folder whose labels are CoNLL-2003's NER tags."""
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    out = tmp_path_factory.mktemp("named")
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    torch.manual_seed(0)
    BertForTokenClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, num_labels=len(NER),
                                          id2label=dict(enumerate(NER)), label2id={t: i for i, t in enumerate(NER)})
                               ).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def test_predict_tags_a_file_of_words_alone(named_folder, tmp_path):
    """Predicting needs no tags: a file of one column (words) is tagged, not refused as `word_column 0 and
    tag_column -1 are the same column`."""
    words = tmp_path / "words.txt"
    words.write_text("Ana\nwent\nto\nOslo\n\nBob\nstayed\n", encoding="utf-8")
    out = posbias.predict(str(named_folder), data=str(words), task="tagging", output_dir=str(tmp_path / "pred"))
    assert [v["words"] for v in out.values()] == [["Ana", "went", "to", "Oslo"], ["Bob", "stayed"]]
    assert all(len(v["tags"]) == len(v["words"]) and set(v["tags"]) <= set(NER) for v in out.values())
    r = run_cli("predict", "tagging", "--model", str(named_folder), "--data", str(words))
    assert r.returncode == 0, r.stderr
    broken = tmp_path / "broken.txt"  # two columns on one line, one on the others: still refused, named
    broken.write_text("Ana B-PER\nwent\n", encoding="utf-8")
    with pytest.raises(Exception, match="broken.txt"):
        posbias.predict(str(named_folder), data=str(broken), task="tagging")
