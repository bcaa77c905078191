"""Context Perturbation: every sentence and its labels survive the concatenation, groups fit M, the
orders of a group are distinct, and runs are reproducible."""
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from posbias.config import RESOURCES, build_config, config_from
from posbias.errors import ConfigError
from posbias.perturb import build_perturbations, training_passes
from posbias.perturb.context_concat import concatenate_contexts, distinct_permutations, group_rows
from posbias.tagging.collate import collate
from posbias.tagging.features import IGNORE, build_tagging_features, separator_id, special_tokens
from posbias.tagging.inputs import tagging_tokenizer

from helpers import TINY_ENCODER

TOKENIZERS = {"wordpiece": "tiny_tokenizer", "bpe_roberta": "tiny_bpe_roberta", "bpe_gpt2": "tiny_bpe_gpt2"}


@pytest.fixture(scope="module")
def toks():
    return {name: tagging_tokenizer(str(RESOURCES / folder)) for name, folder in TOKENIZERS.items()}


@pytest.fixture(scope="module")
def wnut():
    from posbias.tagging.readers import read_tagging

    ds = read_tagging(str(RESOURCES / "tagging_demo" / "wnut-train.conll.gz"))
    examples = ds.examples[:48]
    tags = sorted({t for e in examples for t in e.tags})
    return examples, ["O"] + [t for t in tags if t != "O"]


def tagging_batch(tok, wnut, side="right", rows=16, max_seq_len=64):
    examples, labels = wnut
    feats = build_tagging_features(examples, tok, labels=labels, scheme="iob2", max_seq_len=max_seq_len, stride=16)
    return collate(feats, np.arange(rows), pad_id=tok.pad_token_id, padding_side=side, with_labels=True)


def cp_tokens(tok, side="right") -> dict:
    prefix, suffix = special_tokens(tok)
    return {"prefix": prefix, "suffix": suffix, "sep_id": separator_id(tok), "pad_id": tok.pad_token_id,
            "padding_side": side}


FIELDS = ("input_ids", "labels", "word_index", "predict")


def body(batch, r) -> dict:
    """Row r's body: its real tokens from the first word token to the last, field by field."""
    at = torch.nonzero(batch["attention_mask"][r].bool() & (batch["word_index"][r] >= 0)).flatten()
    a, e = (int(at[0]), int(at[-1]) + 1) if len(at) else (0, 0)
    return {k: batch[k][r, a:e].tolist() for k in FIELDS}


def decode_back(batch, out, tokens, max_len) -> None:
    """Assert that each output row is prefix + source bodies joined by [SEP] + suffix, the sources
    being `concat_rows` in order; that the specials carry no label; that groups of several rows fit
    `max_len`; and that each group's rows appear in distinct orders, each source once per order."""
    prefix, suffix, sep = tokens["prefix"], tokens["suffix"], tokens["sep_id"]
    assert out["input_ids"].shape[0] == batch["input_ids"].shape[0]  # batch size kept
    orders = []
    for r in range(out["input_ids"].shape[0]):
        real = out["attention_mask"][r].bool()
        row = {k: out[k][r][real].tolist() for k in FIELDS}
        ids, n = row["input_ids"], len(row["input_ids"])
        assert ids[: len(prefix)] == prefix and ids[n - len(suffix):] == suffix
        sources = [int(x) for x in out["concat_rows"][r] if x >= 0]
        if len(sources) > 1:
            assert n <= max_len, f"row {r}: {n} tokens > M = {max_len}"
        # Split the middle at the separators (word index -1 there: a [SEP] id inside a word would not split).
        middle = {k: v[len(prefix): n - len(suffix)] for k, v in row.items()}
        cuts = [i for i, (t, w) in enumerate(zip(middle["input_ids"], middle["word_index"])) if t == sep and w == -1]
        assert len(cuts) == len(sources) - 1, (r, cuts, sources)
        bounds = [-1] + cuts + [len(middle["input_ids"])]
        for j, src in enumerate(sources):
            piece = {k: v[bounds[j] + 1: bounds[j + 1]] for k, v in middle.items()}
            assert piece == body(batch, src), f"row {r}: sentence {j} is not source row {src}"
        outside = [i for i in range(n) if i < len(prefix) or i >= n - len(suffix)]
        outside += [len(prefix) + c for c in cuts]
        assert all(row["labels"][i] == IGNORE and row["word_index"][i] == -1 and not row["predict"][i] for i in outside)
        orders.append(tuple(sources))
    # Groups: consecutive output rows sharing the same set of sources, one order per member.
    by_group = {}
    for r, o in enumerate(orders):
        by_group.setdefault(frozenset(o), []).append((r, o))
    for members, rows in by_group.items():
        assert len(rows) == len(members) and sorted(r for r, _ in rows) == sorted(members)
        assert len({o for _, o in rows}) == len(rows), "a group's orders repeat"
    assert sorted(x for o in by_group for x in o) == list(range(out["input_ids"].shape[0]))  # a partition


@pytest.mark.parametrize("tok_name", list(TOKENIZERS))
@pytest.mark.parametrize("side", ["right", "left"])
def test_every_sentence_and_label_survives(toks, wnut, tok_name, side):
    tok = toks[tok_name]
    batch = tagging_batch(tok, wnut, side)
    batch["token_type_ids"] = torch.ones_like(batch["input_ids"])
    batch["position_ids"] = torch.zeros_like(batch["input_ids"])
    before = {k: v.clone() for k, v in batch.items()}
    tokens = cp_tokens(tok, side)
    out = concatenate_contexts(batch, torch.Generator().manual_seed(0), max_len=96, **tokens)
    assert all(torch.equal(before[k], batch[k]) for k in before)  # input not modified
    decode_back(batch, out, tokens, 96)
    sizes = Counter(int((out["concat_rows"][r] >= 0).sum()) for r in range(16))
    assert max(sizes) >= 2  # rows were actually concatenated
    assert "position_ids" not in out and "position_shift" not in out
    assert (out["token_type_ids"] == 0).all()
    real = out["attention_mask"].bool()
    lens = real.sum(1)
    if side == "left":
        assert (out["pad_left"] == out["input_ids"].shape[1] - lens).all()
        assert real[:, -1].all()
    else:
        assert (out["pad_left"] == 0).all() and real[:, 0].all()
    assert (out["input_ids"][~real] == tok.pad_token_id).all() and (out["labels"][~real] == IGNORE).all()
    if tokens["prefix"]:
        assert (out["cls_index"] == out["pad_left"]).all()
        assert (out["input_ids"][torch.arange(16), out["cls_index"]] == tokens["prefix"][0]).all()
    else:  # GPT-2: no leading special
        assert (out["cls_index"] == -1).all()
    assert torch.equal(out["window"], batch["window"][out["concat_rows"][:, 0]])
    # Same generator seed, same output; another seed, other orders.
    again = concatenate_contexts(batch, torch.Generator().manual_seed(0), max_len=96, **tokens)
    assert all(torch.equal(out[k], again[k]) for k in out)
    other = concatenate_contexts(batch, torch.Generator().manual_seed(1), max_len=96, **tokens)
    assert not torch.equal(other["concat_rows"], out["concat_rows"])


def test_bert_rows_read_as_in_the_paper(toks):
    """[CLS] s1 [SEP] s2 [SEP]: three hand-made rows, M fitting exactly two of them."""
    tok = toks["wordpiece"]
    cls, sep = tok.cls_token_id, tok.sep_token_id
    ids = torch.tensor([[cls, 10, 11, sep, 0], [cls, 20, 21, 22, sep], [cls, 30, sep, 0, 0]])
    mask = (torch.arange(5)[None] < torch.tensor([[4], [5], [3]])).long()
    word = torch.tensor([[-1, 0, 1, -1, -1], [-1, 0, 0, 1, -1], [-1, 0, -1, -1, -1]])
    labels = torch.where(word >= 0, torch.tensor([[0, 1, 2, 0, 0], [0, 3, -100, 4, 0], [0, 5, 0, 0, 0]]), IGNORE)
    batch = {"input_ids": ids, "attention_mask": mask, "word_index": word, "predict": word >= 0, "labels": labels,
             "cls_index": torch.zeros(3, dtype=torch.long), "pad_left": torch.zeros(3, dtype=torch.long),
             "window": torch.tensor([7, 8, 9])}
    # bodies 2, 3, 1: [CLS] 2 [SEP] 3 [SEP] = 8 tokens; the third row would make 10 > 9
    out = concatenate_contexts(batch, torch.Generator().manual_seed(0), max_len=9, **cp_tokens(tok))
    rows = {tuple(out["concat_rows"][r].tolist()): out["input_ids"][r][out["attention_mask"][r].bool()].tolist()
            for r in range(3)}
    assert rows == {(0, 1): [cls, 10, 11, sep, 20, 21, 22, sep], (1, 0): [cls, 20, 21, 22, sep, 10, 11, sep],
                    (2, -1): [cls, 30, sep]}
    r01 = [r for r in range(3) if out["concat_rows"][r].tolist() == [0, 1]][0]
    assert out["labels"][r01].tolist() == [IGNORE, 1, 2, IGNORE, 3, IGNORE, 4, IGNORE]
    assert out["word_index"][r01].tolist() == [-1, 0, 1, -1, 0, 0, 1, -1]
    assert out["window"].tolist() == [7 if out["concat_rows"][r, 0] == 0 else 8 if out["concat_rows"][r, 0] == 1
                                      else 9 for r in range(3)]


def test_a_wrong_concatenation_fails_the_decoding(toks, wnut):
    """The decoding check can fail: labels moved by one token, or a separator dropped, are caught."""
    tok = toks["wordpiece"]
    batch = tagging_batch(tok, wnut)
    tokens = cp_tokens(tok)
    out = concatenate_contexts(batch, torch.Generator().manual_seed(0), max_len=96, **tokens)
    shifted = {**out, "labels": out["labels"].roll(1, dims=1)}
    with pytest.raises(AssertionError):
        decode_back(batch, shifted, tokens, 96)
    r = int(torch.nonzero((out["concat_rows"] >= 0).sum(1) > 1)[0])  # a concatenated row
    ids = out["input_ids"].clone()
    first_sep = int(torch.nonzero((ids[r] == tokens["sep_id"]) & (out["word_index"][r] == -1))[0])
    ids[r, first_sep] = 1  # a separator turned into another token
    with pytest.raises(AssertionError):
        decode_back(batch, {**out, "input_ids": ids}, tokens, 96)


def test_greedy_grouping_in_batch_order():
    # overhead 2 ([CLS], [SEP]), M = 12: 2+3 = 5; +1+4 = 10; the 10-token row needs 21 > 12: alone;
    # then 2+2 = 4, +1+2 = 7.
    assert group_rows([3, 4, 10, 2, 2], 2, 12) == [[0, 1], [2], [3, 4]]
    assert group_rows([20, 1, 1], 2, 12) == [[0], [1, 2]]  # a row longer than M by itself stays alone
    assert group_rows([5, 5], 2, 13) == [[0, 1]] and group_rows([5, 5], 2, 12) == [[0], [1]]  # 2+5+1+5 = 13
    assert group_rows([], 2, 12) == []


def test_permutations_are_distinct_uniform_and_seeded():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 5):
        perms = distinct_permutations(n, g)
        assert len(perms) == n and len({tuple(p) for p in perms}) == n
        assert all(sorted(p) == list(range(n)) for p in perms)
    assert sorted(distinct_permutations(2, g)) == [[0, 1], [1, 0]]
    assert distinct_permutations(4, torch.Generator().manual_seed(3)) == \
        distinct_permutations(4, torch.Generator().manual_seed(3))
    counts = Counter(tuple(distinct_permutations(3, g)[0]) for _ in range(6000))  # uniform over 3! orders
    assert len(counts) == math.factorial(3) and min(counts.values()) > 850 and max(counts.values()) < 1150


def tiny_tagger(tok, n_pos=512):
    from transformers import AutoConfig, AutoModel

    from posbias.tagging.model import TaggerModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**{**TINY_ENCODER, "max_position_embeddings": n_pos, "vocab_size": len(tok)})
    return TaggerModel(AutoModel.from_config(cfg, add_pooling_layer=False), ["O", "B-x"], "iob2")


def test_options_bind_and_errors(toks, wnut):
    tok = toks["wordpiece"]
    base = config_from("tiny_tagging")
    cfg = build_config(base.to_dict() | {"perturb": [{"name": "context_perturbation"}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    assert p.max_len == cfg.data.max_seq_len == 128
    with pytest.raises(RuntimeError, match="bind"):
        p(tagging_batch(tok, wnut), torch.Generator())
    p.bind(tiny_tagger(tok), tok)
    out = p(tagging_batch(tok, wnut), torch.Generator().manual_seed(0))
    assert int(out["attention_mask"].sum(1).max()) <= 128
    too_long = build_config(base.to_dict() | {"perturb": [{"name": "context_perturbation", "max_len": 600}]})
    (p,) = build_perturbations(too_long.perturb, too_long)
    with pytest.raises(ConfigError, match=r"perturb\[0\]\.max_len \(600\).*max_position_embeddings \(512\)"):
        p.bind(tiny_tagger(tok), tok)
    with pytest.raises(ConfigError, match=r"perturb\[0\]: unknown option 'cap'"):
        build_config(base.to_dict() | {"perturb": [{"name": "context_perturbation", "cap": 3}]})
    with pytest.raises(ConfigError, match=r"perturb\[0\]\.mode must be one of"):
        build_config(base.to_dict() | {"perturb": [{"name": "context_perturbation", "mode": "twice"}]})
    with pytest.raises(ConfigError, match=r"perturb\[0\]: context_perturbation .* task 'qa'"):
        config_from("tiny", ["perturb=[{name: context_perturbation}]"])
    with pytest.raises(ValueError, match="cannot rebuild"):
        concatenate_contexts({**tagging_batch(tok, wnut), "span_mask": torch.zeros(1)}, torch.Generator(),
                             max_len=96, **cp_tokens(tok))


def test_rpp_after_cp_stays_in_the_table(toks, wnut):
    """Replace CP then augment RPP (as training composes them): the concatenations' positions, shifted,
    stay below the table; the augment pass is made from the concatenated batch."""
    tok = toks["bpe_roberta"]
    model = tiny_tagger(tok, n_pos=130)  # a BERT encoder (base 0) under the RoBERTa BPE tokenizer
    cfg = build_config(config_from("tiny_tagging").to_dict() | {
        "perturb": [{"name": "context_perturbation", "max_len": 128, "mode": "replace"}, {"name": "rpp"}]})
    built = build_perturbations(cfg.perturb, cfg, with_modes=True)
    for p, _ in built:
        p.bind(model, tok)
    assert [m for _, m in built] == ["replace", "augment"]
    batch = tagging_batch(tok, wnut, "left")
    clean, shifted = training_passes(batch, [built[0][0]], [built[1][0]], torch.Generator().manual_seed(0))
    assert torch.equal(clean["input_ids"], shifted["input_ids"]) and "concat_rows" in shifted
    real = shifted["attention_mask"].bool()
    assert int(shifted["position_ids"][real].max()) < 130
    assert (shifted["position_ids"][torch.arange(16), shifted["cls_index"]] == 0).all()


def test_training_with_context_perturbation_runs(tmp_path):
    """tiny_tagging, 2 steps, CP with M = 256 (twice data.max_seq_len): concatenations reach positions
    past 128 and none past 256; in augment mode the step also trains the clean batch."""
    import posbias

    def run(name, spec):
        out = tmp_path / name
        cfg = config_from("tiny_tagging", [f"train.output_dir={out}", "train.max_steps=2", "data.eval_file=null",
                                           f"perturb=[{spec}]"])
        summary = posbias.train(cfg, progress=False)
        assert summary["steps"] == 2
        return json.loads((out / "position_updates.json").read_text(encoding="utf-8"))["counts"]

    counts = run("replace", "{name: context_perturbation, max_len: 256, mode: replace}")
    assert counts[0] == 2 and sum(counts[128:256]) > 0 and sum(counts[256:]) == 0
    counts = run("augment", "{name: context_perturbation, max_len: 256}")  # CP's default: augment
    assert counts[0] == 2 and sum(counts[128:256]) > 0
