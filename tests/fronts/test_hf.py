"""posbias.hf: collators that wrap Hugging Face collators, the F1(alpha) callback, under a real Trainer."""
import os
import warnings

import numpy as np
import pytest
import torch
from transformers import (AutoTokenizer, BertConfig, BertForTokenClassification, DataCollatorForTokenClassification,
                          RobertaConfig, RobertaForTokenClassification)

from posbias.config import RESOURCES
from posbias.errors import ConfigError
from posbias.hf import (VIEW, ContextPerturbationCollator, PerturbationCollator, PositionBiasCallback,
                        PositionShiftCollator)

from helpers.hf import LABELS, SENTENCES, SMALL, bert, features, tiny_trainer


@pytest.fixture(scope="module")
def bert_tok():
    return AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))


def test_rpp_collator_shifts_positions_and_keeps_cls(bert_tok):
    model = bert(bert_tok).train()
    coll = PositionShiftCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, method="rpp", seed=1,
                                 mode="replace")
    out = coll(features(bert_tok))
    batch = out[VIEW]  # what training forwards take; the top level is the clean batch
    plain = DataCollatorForTokenClassification(bert_tok)(features(bert_tok))
    assert set(out) == set(plain) | {VIEW}
    for k in plain:  # the wrapped collator's fields are untouched, at the top level and in the view
        assert torch.equal(out[k], plain[k]) and torch.equal(batch[k], plain[k])
    pos, mask = batch["position_ids"], batch["attention_mask"]
    assert pos.shape == mask.shape and (pos[:, 0] == 0).all()  # [CLS] keeps position 0
    lengths = mask.sum(-1)
    for r in range(pos.shape[0]):
        real = pos[r, : lengths[r]]
        # consecutive after [CLS], starting at p_r in the paper's interval [l, M - l]
        assert torch.equal(real[1:] - real[1], torch.arange(int(lengths[r]) - 1))
        assert int(lengths[r]) <= int(real[1]) <= 64 - int(lengths[r])
        assert (pos[r, lengths[r]:] == 0).all() and int(real.max()) < 64
    # The model's hook: the view in training forwards, the clean batch otherwise.
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(dict(kw)), with_kwargs=True)
    with torch.no_grad():
        model(**out)
        model.eval()
        model(**out)
    assert torch.equal(seen[0]["position_ids"], pos) and VIEW not in seen[0]
    assert "position_ids" not in seen[1] and VIEW not in seen[1]


def test_randomized_positions_collator_sorted_within_table_cls_kept(bert_tok):
    model = bert(bert_tok).train()
    coll = PositionShiftCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok,
                                 method="randomized_positions", seed=3)
    assert coll.mode == "replace" and coll.max_len == 64  # the paper trains randomized positions only
    batch = coll(features(bert_tok))[VIEW]
    pos, mask = batch["position_ids"], batch["attention_mask"]
    lengths = mask.sum(-1)
    plain_shift = 0
    for r in range(pos.shape[0]):
        real = pos[r, : lengths[r]]
        assert int(real[0]) == 0 and int(real.max()) < 64  # [CLS] at its base, ids within the table
        assert bool((real[1:] > real[:-1]).all())  # strictly increasing
        assert (pos[r, lengths[r]:] == 0).all()  # padding at the pad position
        plain_shift += bool((real[2:] - real[1:-1] == 1).all())
    assert plain_shift < pos.shape[0]  # not one shift per row: per-token ids (4 rows, P(all consecutive) tiny)
    with pytest.raises(ConfigError, match="max_len"):
        PositionShiftCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok,
                              method="randomized_positions", max_len=3)(features(bert_tok))


def test_random_padding_collator_and_roberta_numbering():
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_bpe_roberta"))
    torch.manual_seed(0)
    model = RobertaForTokenClassification(RobertaConfig(vocab_size=len(tok), max_position_embeddings=66, pad_token_id=1,
                                                        num_labels=len(LABELS), **SMALL)).train()
    coll = PositionShiftCollator(DataCollatorForTokenClassification(tok), model, tok, method="random_padding",
                                 max_len=32, seed=3)
    batch = coll(features(tok))[VIEW]
    pos, mask = batch["position_ids"], batch["attention_mask"]
    assert (pos[:, 0] == 2).all() and (pos[mask == 0] == 1).all()  # RoBERTa: <s> at padding_idx + 1
    shifts = pos[:, 1] - 3
    assert (shifts >= 0).all() and (shifts <= 32 - mask.sum(-1)).all()  # k ~ U{0 .. n - m}
    with pytest.raises(ConfigError, match=r"max_len \(70\) \+ first position id \(2\) exceeds"):
        PositionShiftCollator(DataCollatorForTokenClassification(tok), model, tok, method="random_padding", max_len=70)


def test_model_without_position_ids_is_refused(bert_tok):
    from transformers import BloomConfig, BloomForTokenClassification

    model = BloomForTokenClassification(BloomConfig(vocab_size=len(bert_tok), hidden_size=32, n_layer=1, n_head=4,
                                                    num_labels=2))  # ALiBi: no position ids at all
    with pytest.raises(ConfigError, match=r"^BloomForTokenClassification: bloom uses no position ids \(config has no "
                                          r"max_position_embeddings\): shifted ids have no position table to index"):
        PositionShiftCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok)


def _labelled_words(batch, r, tok):
    ids, labels = batch["input_ids"][r].tolist(), batch["labels"][r].tolist()
    return [(tok.convert_ids_to_tokens(i), LABELS[l]) for i, l in zip(ids, labels) if l != -100]


COLLATORS = {
    "rpp": lambda model, tok: PositionShiftCollator(DataCollatorForTokenClassification(tok), model, tok, method="rpp",
                                                    seed=5),
    "context_perturbation": lambda model, tok: ContextPerturbationCollator(DataCollatorForTokenClassification(tok),
                                                                           model, tok, max_len=40, seed=5),
    "random_padding (generic)": lambda model, tok: PerturbationCollator(DataCollatorForTokenClassification(tok), model,
                                                                        tok, "random_padding", max_len=40, seed=5),
}


@pytest.mark.parametrize("name", list(COLLATORS))
def test_collators_perturb_a_global_batch_alike_on_one_process_or_two(bert_tok, name):
    """accelerate gives process r of N the global batches r, r + N, ...: with one collator per
    process, every global batch gets the perturbation the single process's collator gives it (the
    draw is the batch's own, not the n-th of a process's generator); a batch seen again draws anew."""
    feats = features(bert_tok)
    batches = [[feats[i] for i in order] for order in ([0, 1], [2, 3], [1, 2], [3, 0], [0, 1])]
    model = bert(bert_tok).train()
    one = COLLATORS[name](model, bert_tok)
    alone = [one(b)[VIEW] for b in batches]
    ranks = [COLLATORS[name](model, bert_tok) for _ in range(2)]
    shared = [ranks[g % 2](b)[VIEW] for g, b in enumerate(batches)]
    for g, (x, y) in enumerate(zip(alone, shared)):
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x), f"global batch {g}"
    perturbed = "position_ids" if name != "context_perturbation" else "input_ids"
    views = [one(batches[0])[VIEW][perturbed] for _ in range(8)]  # batch 0 again, and again
    assert any(not torch.equal(v, alone[0][perturbed]) for v in views)


def test_context_perturbation_collator_carries_labels(bert_tok):
    model = bert(bert_tok).train()
    feats = features(bert_tok)
    coll = ContextPerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, max_len=40, seed=0,
                                       mode="replace")
    out = coll(feats)[VIEW]
    plain = DataCollatorForTokenClassification(bert_tok)(feats)
    assert set(out) == {"input_ids", "attention_mask", "labels"} and out["input_ids"].shape[0] == len(feats)
    sources = [_labelled_words(plain, r, bert_tok) for r in range(len(feats))]
    rows = [_labelled_words(out, r, bert_tok) for r in range(len(feats))]
    sep = bert_tok.sep_token_id
    assert any((out["input_ids"][r] == sep).sum() > 1 for r in range(len(feats)))  # packed rows exist
    for row in rows:  # every packed row is a concatenation of whole source sentences, labels kept
        rest = list(row)
        while rest:
            src = next(s for s in sources if rest[: len(s)] == s)
            rest = rest[len(src):]
    assert sorted(map(tuple, sources)) == sorted({tuple(s) for row in rows for s in sources
                                                   if any(row[i:i + len(s)] == s for i in range(len(row)))})
    aug = ContextPerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, max_len=40,
                                      mode="augment")(feats)[VIEW]
    assert aug["input_ids"].shape[0] == 2 * len(feats)
    s = plain["input_ids"].shape[1]
    assert torch.equal(aug["input_ids"][: len(feats), :s], plain["input_ids"])  # clean rows first


def test_perturbations_reach_the_model_under_trainer(bert_tok, tmp_path):
    model = bert(bert_tok)
    coll = PositionShiftCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, method="rpp",
                                 mode="augment")
    seen = []  # registered after the collator's hook: sees what the forward receives
    model.register_forward_pre_hook(lambda m, a, kw: seen.append((m.training, kw.get("position_ids"),
                                                                  kw["input_ids"].shape[0])), with_kwargs=True)
    trainer = tiny_trainer(tmp_path, model, bert_tok, coll)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
        trainer.evaluate()
    train_calls = [s for s in seen if s[0]]
    assert len(train_calls) == 3
    for _, pos, rows in train_calls:  # augment: clean rows with 0.., then shifted copies
        assert rows == 8 and pos is not None and (pos[4:, 1] > pos[:4, 1]).any()
        assert torch.equal(pos[:4, 1], torch.ones(4, dtype=torch.long))
    assert all(pos is None and rows == 4 for training, pos, rows in seen if not training)


def test_f1_alpha_callback_adds_metrics(bert_tok, tmp_path):
    conll = tmp_path / "dev.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in SENTENCES * 3) + "\n",
                     encoding="utf-8")
    model = bert(bert_tok)
    coll = DataCollatorForTokenClassification(bert_tok)
    trainer = tiny_trainer(tmp_path, model, bert_tok, coll)
    cb = PositionBiasCallback(conll, bert_tok, k_max=3, alphas=(1, 3), quantiles=None).attach(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = trainer.evaluate()
    assert {"eval_f1_alpha_1", "eval_f1_alpha_3"} <= set(metrics) and "eval_loss" in metrics
    assert 0 <= metrics["eval_f1_alpha_3"] <= 100
    logged = [r for r in trainer.state.log_history if "eval_f1_alpha_3" in r]
    assert logged and cb.history[-1]["eval_f1_alpha_3"] == metrics["eval_f1_alpha_3"]
    # the callback's value is posbias's own F1(alpha) of the same weights
    direct = cb.position_metrics(model)
    assert direct["eval_f1_alpha_3"] == pytest.approx(metrics["eval_f1_alpha_3"])


def test_f1_alpha_callback_names_generic_labels_and_the_right_column(bert_tok, tmp_path):
    """A model whose config never set id2label (LABEL_0..LABEL_4) is refused by name, with the
    callback's own way out (labels=...); a file whose NER tags are not its last column gets the
    column to read, in read_tagging's words."""
    conll = tmp_path / "dev.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in SENTENCES * 3) + "\n",
                     encoding="utf-8")
    torch.manual_seed(0)
    generic = BertForTokenClassification(BertConfig(vocab_size=len(bert_tok), max_position_embeddings=64,
                                                    num_labels=len(LABELS), **SMALL))
    cb = PositionBiasCallback(conll, bert_tok, k_max=2, alphas=(1, 2), quantiles=None)
    with pytest.raises(ConfigError, match=r"^model\.config: the label names \(id2label\) are generic, LABEL_0\.\."
                                          r"LABEL_4 .* entity tags \(B-PER, .*pass labels=\[\.\.\.\] \(the tag names "
                                          r"in id order\) to PositionBiasCallback"):
        cb.position_metrics(generic)
    named = PositionBiasCallback(conll, bert_tok, labels=LABELS, k_max=2, alphas=(1, 2), quantiles=None)
    assert set(named.position_metrics(generic)) == {"eval_f1_alpha_1", "eval_f1_alpha_2"}
    swapped = tmp_path / "ner_pos.conll"  # word NER POS: the default (last) column is POS
    swapped.write_text("\n\n".join("\n".join(f"{w} {t} NN" for w, t in zip(*s)) for s in SENTENCES) + "\n",
                       encoding="utf-8")
    with pytest.raises(ConfigError, match=r"the file's column 1 \(B-PER, .*\) holds the model's tags: set "
                                          r"data=posbias\.tagging\.readers\.read_tagging\(path, tag_column=1\) "):
        PositionBiasCallback(swapped, bert_tok, k_max=2, quantiles=None).position_metrics(bert(bert_tok))


def test_f1_alpha_callback_follows_the_trainers_bf16(bert_tok, tmp_path):
    """precision="trainer": TrainingArguments(bf16=True) runs the duplicated-test forwards under bf16
    autocast (seen as the dtype of a linear layer's output), fp32 otherwise; a bad value is refused."""
    from types import SimpleNamespace

    conll = tmp_path / "dev.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in SENTENCES * 3) + "\n",
                     encoding="utf-8")
    model = bert(bert_tok)
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    seen = []
    linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    cb = PositionBiasCallback(conll, bert_tok, k_max=3, alphas=(1, 3), quantiles=None)
    a = cb.position_metrics(model, SimpleNamespace(bf16=True, fp16=False))
    assert seen and set(seen) == {torch.bfloat16}
    seen.clear()
    b = cb.position_metrics(model, SimpleNamespace(bf16=False, fp16=False))
    assert seen and set(seen) == {torch.float32}
    assert set(a) == set(b)
    with pytest.raises(ConfigError, match="precision must be trainer or one of"):
        PositionBiasCallback(conll, bert_tok, precision="half")


def test_f1_alpha_callback_cuts_d_star_by_the_pooled_lengths(bert_tok, tmp_path):
    """Default: D*'s bounds are quantiles of the test file's own lengths; `length_pool` pools other
    files' (the authors pool train, dev and test)."""
    from posbias.tagging.readers import read_tagging

    def write(name, sentences):
        path = tmp_path / name
        path.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in sentences) + "\n",
                        encoding="utf-8")
        return path

    test = write("test.conll", SENTENCES * 3)  # lengths 4, 3, 6, 1 three times: Q1-Q3 = [2.5, 4.5]
    longest = write("train.conll", [SENTENCES[2]] * 5)  # only 6-word sentences
    model = bert(bert_tok)
    own = PositionBiasCallback(test, bert_tok, k_max=2, alphas=(1, 2))
    own.position_metrics(model)
    assert own.subset["length_bounds"] == [2.5, 4.5] and own.subset["subset_sentences"] == 6
    assert own.subset["pool"] is None
    pooled = PositionBiasCallback(test, bert_tok, k_max=2, alphas=(1, 2), length_pool=[longest, read_tagging(str(test))])
    pooled.position_metrics(model)
    # 5 six-word + 12 test sentences pooled
    lengths = sorted([6] * 5 + [4, 3, 6, 1] * 3)
    assert pooled.subset["length_bounds"] == pytest.approx(list(np.quantile(lengths, [0.25, 0.75])))
    assert pooled.subset["pool_sentences"] == 17 and pooled.subset["pool"][0] == str(longest)
    only_long = PositionBiasCallback(test, bert_tok, k_max=2, alphas=(1, 2), length_pool=longest)
    only_long.position_metrics(model)
    assert only_long.subset["length_bounds"] == [6.0, 6.0] and only_long.subset["subset_sentences"] == 3
    as_bytes = PositionBiasCallback(test, bert_tok, k_max=2, alphas=(1, 2), length_pool=os.fsencode(longest))
    as_bytes.position_metrics(model)
    assert as_bytes.subset["length_bounds"] == [6.0, 6.0] and as_bytes.subset["pool"] == [str(longest)]
    with pytest.raises(ConfigError, match="length_pool must name"):
        PositionBiasCallback(test, bert_tok, length_pool=[])


def test_collators_default_to_the_authors_step(bert_tok, tmp_path):
    """RPP and CP add a clean pass by default (issue 29: replace RPP never trains positions 1..l-1);
    Random Padding trains the re-padded batch only, as its paper."""
    model = bert(bert_tok)
    base = DataCollatorForTokenClassification(bert_tok)
    assert PositionShiftCollator(base, model, bert_tok, method="rpp").mode == "augment"
    assert PositionShiftCollator(base, model, bert_tok, method="random_padding").mode == "replace"
    assert ContextPerturbationCollator(base, model, bert_tok, max_len=40).mode == "augment"
