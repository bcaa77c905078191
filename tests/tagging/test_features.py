"""Word alignment, labels and sliding windows: every gold tag survives, every word is predicted once."""
import numpy as np
import pytest

from posbias.config import RESOURCES
from posbias.errors import ConfigError
from posbias.tagging.collate import collate
from posbias.tagging.examples import TaggingExample
from posbias.tagging.features import IGNORE, _windows, build_tagging_features, special_tokens
from posbias.tagging.inputs import tagging_tokenizer


@pytest.fixture(scope="module")
def wordpiece():
    return tagging_tokenizer(str(RESOURCES / "tiny_tokenizer"))


@pytest.fixture(scope="module")
def bpe_roberta():
    return tagging_tokenizer(str(RESOURCES / "tiny_bpe_roberta"))


@pytest.fixture(scope="module")
def bpe_gpt2():
    return tagging_tokenizer(str(RESOURCES / "tiny_bpe_gpt2"))


def wnut(n=None):
    from posbias.tagging.readers import read_tagging

    ds = read_tagging(str(RESOURCES / "tagging_demo" / "wnut-train.conll.gz"))
    return ds.examples[:n] if n else ds.examples, ds


def labels_of(examples):
    tags = sorted({t for e in examples for t in e.tags})
    return ["O"] + [t for t in tags if t != "O"]


def decode_back(feats, examples, labels):
    """Per sentence, the tag each word gets back from the window that predicts it."""
    out = [[None] * len(e.words) for e in examples]
    for w in range(len(feats)):
        ex = feats.example_index[w]
        for j in np.flatnonzero(feats.predict[w]):
            word = feats.word_index[w][j]
            assert out[ex][word] is None, "a word is predicted by two windows"
            out[ex][word] = labels[feats.labels[w][j]]
    return out


@pytest.mark.parametrize("tok_name", ["wordpiece", "bpe_roberta", "bpe_gpt2"])
@pytest.mark.parametrize("max_seq_len, stride", [(128, 32), (12, 3)])
def test_every_gold_tag_survives_alignment_and_windows(request, tok_name, max_seq_len, stride):
    """Decoding the labels back to words gives the gold tags, for one window per sentence and for
    windows so small that most sentences need several."""
    tok = request.getfixturevalue(tok_name)
    examples, _ = wnut(200)
    labels = labels_of(examples)
    feats = build_tagging_features(examples, tok, labels=labels, scheme="iob2", max_seq_len=max_seq_len,
                                   stride=stride)
    assert decode_back(feats, examples, labels) == [e.tags for e in examples]
    assert all(len(x) <= max_seq_len for x in feats.input_ids)
    if max_seq_len == 12:
        assert feats.stats["long_sentences"] > 100 and len(feats) > 2 * len(examples)
    # Only first sub-tokens carry a label (label_subtokens="first"); special tokens never do.
    for w in range(len(feats)):
        labelled = feats.labels[w] != IGNORE
        assert (feats.word_index[w][labelled] >= 0).all()
        first = np.r_[True, feats.word_index[w][1:] != feats.word_index[w][:-1]] & (feats.word_index[w] >= 0)
        assert not (labelled & ~first).any()


def test_windows_cover_a_long_sentence_with_max_context_owners(wordpiece):
    """A 60-word sentence in 16-token windows: windows start at word starts, consecutive ones share
    at least `stride` tokens, and each word is predicted where it has the most context."""
    words = [f"w{i}" if i % 7 else "electroencephalography" for i in range(60)]  # some words split
    ex = TaggingExample("s", words, ["O"] * 60)
    feats = build_tagging_features([ex], wordpiece, labels=["O"], max_seq_len=16, stride=4)
    assert len(feats) > 5
    prefix, suffix = special_tokens(wordpiece)
    content = [x[len(prefix):len(x) - len(suffix)] for x in feats.word_index]
    for a, b in zip(content, content[1:]):
        shared = len(set(a.tolist()) & set(b.tolist()))
        assert shared >= 1 and b[0] != a[0]  # they overlap, and progress is made
        overlap = len(a) - int(np.flatnonzero(a == b[0])[0])  # tokens of `a` from b's first word on
        # >= stride tokens shared, unless that would mean starting at `a`'s own first word again
        assert overlap >= 4 or b[0] == a[0] + 1
    # Brute force: for each word, the window where min(left, right) context of its first token is largest.
    for word in range(60):
        scores = []
        for w, wi in enumerate(content):
            pos = np.flatnonzero(wi == word)
            if len(pos):
                p = pos[0]
                scores.append((min(p, len(wi) - 1 - p) + 0.01 * len(wi), -w, w))
        owner = max(scores)[2]
        where = [w for w in range(len(feats)) if (feats.word_index[w][feats.predict[w]] == word).any()]
        assert where == [owner]


def test_window_cutting_rules():
    starts = np.array([0, 2, 3, 7, 8, 12])  # word starts in a 15-token sentence
    assert _windows(starts, 15, 20, 4) == [(0, 15)]
    spans = _windows(starts, 15, 8, 3)
    assert spans[0] == (0, 8) and spans[-1][1] == 15
    assert all(a in starts for a, _ in spans)  # windows start at word starts
    # A single word longer than the window is cut rather than looping forever.
    assert _windows(np.array([0, 20]), 22, 8, 2)[0] == (0, 8)


def test_all_subtokens_labelled_inside_their_entity(wordpiece):
    ex = TaggingExample("s", ["electroencephalography", "Paris"], ["B-LOC", "O"])
    labels = ["O", "B-LOC", "I-LOC"]
    feats = build_tagging_features([ex], wordpiece, labels=labels, scheme="iob2", label_subtokens="all")
    lab = feats.labels[0][feats.word_index[0] == 0]
    assert len(lab) > 1 and labels[lab[0]] == "B-LOC" and all(labels[x] == "I-LOC" for x in lab[1:])


def test_copy_gives_every_subtoken_its_words_label_as_it_is(wordpiece):
    """The token-positional-bias authors' `label_all_tokens`: zebra = z ##e ##b ##ra, tagged S-PER,
    gets S-PER on all four pieces (not S-PER I-PER I-PER I-PER); special tokens carry none; the word
    is still predicted at its first piece only."""
    ex = TaggingExample("s", ["the", "zebra", "walked", "london"], ["O", "S-PER", "B-LOC", "E-LOC"])
    labels = ["O", "B-LOC", "E-LOC", "I-LOC", "I-PER", "S-PER"]
    feats = build_tagging_features([ex], wordpiece, labels=labels, scheme="bioes", label_subtokens="copy")
    tokens = wordpiece.convert_ids_to_tokens(feats.input_ids[0].tolist())
    got = [(t, labels[x] if x != IGNORE else None) for t, x in zip(tokens, feats.labels[0].tolist())]
    assert got == [("[CLS]", None), ("the", "O"), ("z", "S-PER"), ("##e", "S-PER"), ("##b", "S-PER"),
                   ("##ra", "S-PER"), ("wal", "B-LOC"), ("##k", "B-LOC"), ("##ed", "B-LOC"), ("london", "E-LOC"),
                   ("[SEP]", None)]
    assert feats.word_index[0][feats.predict[0]].tolist() == [0, 1, 2, 3]
    # `all` puts the continuation pieces inside the entity instead: S-PER I-PER I-PER I-PER.
    inside = build_tagging_features([ex], wordpiece, labels=labels, scheme="bioes", label_subtokens="all")
    assert [labels[x] for x in inside.labels[0][2:6]] == ["S-PER", "I-PER", "I-PER", "I-PER"]
    with pytest.raises(ConfigError, match="data.label_subtokens"):
        build_tagging_features([ex], wordpiece, labels=labels, scheme="bioes", label_subtokens="every")


def test_words_without_tokens_are_predicted_as_unknown(wordpiece):
    """A zero-width character (WNUT-17 and tweets have them) yields no sub-token: it stands in as
    [UNK] so that it still gets a prediction, and is counted."""
    ex = TaggingExample("s", ["a", "\u200b", "b"], ["O", "O", "B-X"])
    feats = build_tagging_features([ex], wordpiece, labels=["O", "B-X"], scheme="iob2")
    assert feats.stats["unknown_token_words"] == 1
    assert sorted(feats.word_index[0][feats.predict[0]].tolist()) == [0, 1, 2]


def test_byte_level_bpe_sees_a_space_before_each_word(bpe_roberta, bpe_gpt2):
    for tok in (bpe_roberta, bpe_gpt2):
        pieces = tok.convert_ids_to_tokens(tok(["Hello", "world"], is_split_into_words=True,
                                               add_special_tokens=False)["input_ids"])
        assert pieces[0].startswith("Ġ") and "Ġworld" in pieces


def test_gpt2_gets_a_pad_token_and_no_leading_special(bpe_gpt2, bpe_roberta, wordpiece):
    assert bpe_gpt2.pad_token is not None and bpe_gpt2.pad_token_id == bpe_gpt2.eos_token_id
    ex = [TaggingExample("a", ["x", "y"], ["O", "O"]), TaggingExample("b", ["x"], ["O"])]
    assert special_tokens(bpe_gpt2) == ([], [])
    assert special_tokens(wordpiece) == ([wordpiece.cls_token_id], [wordpiece.sep_token_id])
    assert special_tokens(bpe_roberta) == ([bpe_roberta.cls_token_id], [bpe_roberta.sep_token_id])
    feats = build_tagging_features(ex, bpe_gpt2, labels=["O"])
    assert (feats.cls_index == -1).all()
    batch = collate(feats, np.arange(2), pad_id=bpe_gpt2.pad_token_id, padding_side="left", with_labels=True)
    assert batch["cls_index"].tolist() == [-1, -1] and batch["pad_left"].tolist()[1] > 0
    feats = build_tagging_features(ex, wordpiece, labels=["O"])
    batch = collate(feats, np.arange(2), pad_id=0, padding_side="left", with_labels=True)
    assert batch["cls_index"].tolist() == [0, int(batch["pad_left"][1])]  # [CLS] moved by the left padding


def test_collate_pads_labels_and_masks(wordpiece):
    examples, _ = wnut(10)
    labels = labels_of(examples)
    feats = build_tagging_features(examples, wordpiece, labels=labels, scheme="iob2")
    batch = collate(feats, np.arange(10), pad_id=0, with_labels=True)
    n_real = batch["attention_mask"].sum(1)
    assert n_real.tolist() == [len(x) for x in feats.input_ids]
    pad = batch["attention_mask"] == 0
    assert (batch["labels"][pad] == IGNORE).all() and not batch["predict"][pad].any()
    assert int(batch["predict"].sum()) == sum(len(e.words) for e in examples)
