"""Hugging Face folders of every imported architecture score in posbias exactly as their own
`AutoModelFor...` forward does (ModernBERT's pre-classifier `head` included), and a folder posbias
cannot reproduce is refused by name (`posbias.parity`)."""
import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoModelForTokenClassification, AutoTokenizer

import posbias
import posbias.qa.model
import posbias.tagging.model
from posbias.checkpoint import load_checkpoint, save_checkpoint
from posbias.config import RESOURCES, build_config, config_from
from posbias.errors import ConfigError
from posbias.parity import PARITY_RTOL, fp32_eval, logits_mismatch

from helpers import DEMO_DEV, assert_close_to_scale

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
# Tiny configs (hidden 32, 2 layers, 4 heads) with each architecture's own fields.
ARCHITECTURES = {
    "bert": SMALL,
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64},
    "roberta": SMALL,
    "electra": {**SMALL, "embedding_size": 16},
    "albert": {**SMALL, "embedding_size": 16},
    "deberta-v2": {**SMALL, "relative_attention": True, "position_biased_input": False,
                   "pos_att_type": ["p2c", "c2p"], "position_buckets": 16},
    "modernbert": {**SMALL, "global_attn_every_n_layers": 2, "local_attention": 16},
}
TASKS = {"qa": AutoModelForQuestionAnswering, "tagging": AutoModelForTokenClassification}
HF_CLASS = {"bert": "Bert", "distilbert": "DistilBert", "roberta": "Roberta", "electra": "Electra",
            "albert": "Albert", "deberta-v2": "DebertaV2", "modernbert": "ModernBert"}
SUFFIX = {"qa": "ForQuestionAnswering", "tagging": "ForTokenClassification"}
WNUT_LABELS = ["O"] + [f"{p}-{t}" for t in ("person", "location", "corporation", "product", "creative-work", "group")
                       for p in "BI"]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))


def hf_config(arch: str, task: str, tok, labels=WNUT_LABELS):
    """A tiny config of `arch` for `task`, its special token ids those of the bundled vocabulary."""
    ids = {"pad_token_id": tok.pad_token_id}
    if arch == "modernbert":  # its defaults name ids of its own 50k vocabulary
        ids.update(bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, cls_token_id=tok.cls_token_id,
                   sep_token_id=tok.sep_token_id)
    extra = {"id2label": dict(enumerate(labels)), "label2id": {t: i for i, t in enumerate(labels)}} if task == "tagging" else {}
    return AutoConfig.for_model(arch, vocab_size=len(tok), **ids, **extra, **ARCHITECTURES[arch])


def hf_folder(path, arch: str, task: str, tok, seed: int = 0):
    """A randomly initialised Hugging Face `task` model of `arch`, saved with the tiny tokenizer."""
    torch.manual_seed(seed)
    model = TASKS[task].from_config(hf_config(arch, task, tok))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def tagging_batch(tok, sentences):
    enc = tok(sentences, is_split_into_words=True, padding=True, return_tensors="pt")  # right padding
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def qa_batch(tok, n=4):
    from posbias.qa.collate import collate
    from posbias.qa.features import build_qa_features
    from posbias.qa.readers import read_qa

    feats = build_qa_features(read_qa(DEMO_DEV).examples[:n], tok, max_seq_len=96, stride=32)
    return collate(feats, np.arange(len(feats)), pad_id=tok.pad_token_id, padding_side="right")


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_an_imported_folder_scores_its_own_forward(tmp_path, tok, arch, task):
    """posbias's logits equal the folder's AutoModelFor... forward on inputs other than the check's
    (padded batches of real data), at the positions posbias scores."""
    folder = hf_folder(tmp_path / "hf", arch, task, tok)
    ours, _, _ = load_checkpoint(folder, task=task)
    theirs = TASKS[task].from_pretrained(str(folder)).eval()
    ours.eval()
    assert type(theirs).__name__ == HF_CLASS[arch] + SUFFIX[task]
    with torch.no_grad():
        if task == "tagging":
            batch = tagging_batch(tok, [["Paris", "is", "in", "France"], ["I", "saw", "Tom", "Hanks", "today", "!"]])
            real = batch["attention_mask"].bool()
            assert_close_to_scale(ours(batch)["logits"][real], theirs(**batch).logits[real], 1e-5, arch)
        else:
            batch = qa_batch(tok)
            kw = {"token_type_ids": batch["token_type_ids"]} if arch not in ("distilbert", "modernbert") else {}
            out, ref = ours(batch), theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kw)
            scored = batch["span_mask"].clone()
            scored[torch.arange(len(scored)), batch["cls_index"]] = True  # context and [CLS]
            assert_close_to_scale(out["start_logits"][scored], ref.start_logits[scored], 1e-5, arch)
            assert_close_to_scale(out["end_logits"][scored], ref.end_logits[scored], 1e-5, arch)
    if arch == "modernbert":  # its dense + GELU + LayerNorm head is carried, shared with the HF model
        assert ours.prediction_head is not None
    else:
        assert ours.prediction_head is None


def _off_by_a_bias(cls, key):
    """`cls` whose forward adds 0.01 to its logits: a head a little off."""
    class OffByABias(cls):
        def forward(self, batch, targets=None):
            out = super().forward(batch, targets)
            for k in key:
                out[k] = out[k] + 1e-2
            return out
    return OffByABias


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("arch", ["bert", "deberta-v2", "modernbert"])
def test_a_perturbed_head_is_refused_by_name(tmp_path, tok, monkeypatch, arch, task):
    folder = hf_folder(tmp_path / "hf", arch, task, tok)
    if task == "qa":
        monkeypatch.setattr(posbias.qa.model, "QAModel", _off_by_a_bias(posbias.qa.model.QAModel,
                                                                       ("start_logits", "end_logits")))
    else:
        monkeypatch.setattr(posbias.tagging.model, "TaggerModel", _off_by_a_bias(posbias.tagging.model.TaggerModel,
                                                                                ("logits",)))
    with pytest.raises(ConfigError) as e:
        load_checkpoint(folder, task=task)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{folder}: posbias cannot reproduce {HF_CLASS[arch]}{SUFFIX[task]}'s "
                                              "forward (its logits differ by 0.01 on a check input)")


@pytest.mark.parametrize("task", list(TASKS))
def test_modernbert_without_its_head_is_refused(tmp_path, tok, monkeypatch, task):
    """The import as it was before the head was carried: ModernBERT's logits then differ, and the
    folder is refused instead of scored as another network."""
    folder = hf_folder(tmp_path / "hf", "modernbert", task, tok)
    module = posbias.qa.model if task == "qa" else posbias.tagging.model
    monkeypatch.setattr(module, "hf_prediction_head", lambda hf: None)
    with pytest.raises(ConfigError, match=rf"cannot reproduce ModernBert{SUFFIX[task]}'s forward \(its logits differ "
                                          r"by \d"):
        load_checkpoint(folder, task=task)


def test_logits_mismatch_is_scaled_to_the_logits_size():
    small = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    assert logits_mismatch(small, small.clone()) is None
    assert logits_mismatch(small + 5e-5, small) is None  # within 1e-4 * max(1, 0.3)
    assert logits_mismatch(small + 5e-4, small) == pytest.approx(5e-4)
    large = small * 1e4  # |logits| up to 3000: tolerance 0.3
    assert logits_mismatch(large + 0.1, large) is None
    assert logits_mismatch(large + 1.0, large) == pytest.approx(1.0)
    assert logits_mismatch(torch.tensor([float("nan")]), torch.tensor([0.0])) == float("inf")
    assert logits_mismatch(torch.empty(0), torch.empty(0)) is None
    assert PARITY_RTOL == 1e-4
    with pytest.raises(ValueError, match="different shapes"):
        logits_mismatch(small, small[:2])


def test_the_check_runs_in_fp32_eval_and_gives_dtypes_and_modes_back():
    net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to(torch.bfloat16).train()
    with fp32_eval(net):
        assert not net.training and all(p.dtype == torch.float32 for p in net.parameters())
        assert not torch.is_grad_enabled()
    assert net.training and all(p.dtype == torch.bfloat16 for p in net.parameters())


def test_a_bf16_folder_passes_the_check_and_stays_bf16(tmp_path, tok):
    torch.manual_seed(0)
    hf = AutoModelForTokenClassification.from_config(hf_config("bert", "tagging", tok)).to(torch.bfloat16)
    hf.save_pretrained(str(tmp_path / "hf"))
    tok.save_pretrained(str(tmp_path / "hf"))
    model, _, _ = load_checkpoint(tmp_path / "hf", task="tagging")
    assert next(model.encoder.parameters()).dtype == torch.bfloat16


def test_tagger_view_carries_the_modernbert_head(tok):
    from posbias.tagging.model import tagger_view

    torch.manual_seed(0)
    hf = AutoModelForTokenClassification.from_config(hf_config("modernbert", "tagging", tok)).eval()
    view = tagger_view(hf)
    assert view.prediction_head is hf.head and view.classifier is hf.classifier  # shared, not copied
    batch = tagging_batch(tok, [["Paris", "is", "big"], ["Hello"]])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        assert_close_to_scale(view(batch)["logits"][real], hf(**batch).logits[real], 1e-5, "view")


def test_posbias_taggers_have_no_prediction_head(tok):
    """posbias's own taggers are unchanged: no head, the same state_dict keys as before."""
    from posbias.tagging.model import build_model

    model = build_model(config_from("tiny_tagging").model, tok, ["O", "B-x", "I-x"], "iob2")
    assert model.prediction_head is None
    assert not any(k.startswith("prediction_head") for k in model.state_dict())
    assert {k for k in model.state_dict() if not k.startswith("encoder.")} == {"classifier.weight", "classifier.bias"}


def test_modernbert_tagger_evaluates_as_its_hugging_face_argmax(tmp_path, tok):
    """End to end: posbias.evaluate's predictions.conll on a tagged file are the HF forward's argmax
    at each word's first sub-token (before the head was carried, most of them differed)."""
    folder = hf_folder(tmp_path / "hf", "modernbert", "tagging", tok, seed=1)
    n = 40
    posbias.evaluate(folder, "demo:wnut-dev", tmp_path / "ev", overrides=[f"data.max_eval_examples={n}",
                                                                          "data.max_seq_len=512"], progress=False)
    lines = (tmp_path / "ev" / "predictions.conll").read_text(encoding="utf-8").split("\n\n")
    ours = [[row.split("\t")[2] for row in block.splitlines()] for block in lines if block.strip()]
    from posbias.tagging.readers import read_tagging

    from posbias.config import resolve_path

    examples = read_tagging(resolve_path("demo:wnut-dev")).examples[:n]
    hf = AutoModelForTokenClassification.from_pretrained(str(folder)).eval()
    theirs = []
    with torch.no_grad():
        for e in examples:
            enc = tok(e.words, is_split_into_words=True, return_tensors="pt")
            pred = hf(**enc).logits[0].argmax(-1).tolist()
            firsts = {}
            for i, w in enumerate(enc.word_ids(0)):
                if w is not None:
                    firsts.setdefault(w, i)
            theirs.append([hf.config.id2label[pred[firsts[w]]] for w in range(len(e.words))])
    assert len(ours) == n and ours == theirs
    assert len({t for s in theirs for t in s}) > 1  # a model that predicts one tag everywhere proves little


def _modernbert_checkpoint(path, tok, task):
    """A posbias checkpoint (encoder + posbias's own head) on a tiny ModernBERT encoder."""
    from posbias.encoders import encoder_from_config

    torch.manual_seed(0)
    encoder = encoder_from_config(hf_config("modernbert", "qa", tok))
    if task == "tagging":
        from posbias.tagging.model import TaggerModel

        cfg = config_from("tiny_tagging")
        model = TaggerModel(encoder, ["O", "B-x", "I-x"], "iob2")
    else:
        from posbias.qa.heads.independent import IndependentHead
        from posbias.qa.model import QAModel

        cfg = build_config({"model": {"name_or_path": None, "tokenizer": "tiny",
                                      "encoder": {"model_type": "modernbert", **SMALL}}})
        model = QAModel(encoder, IndependentHead(32), "independent", False)
    save_checkpoint(model, cfg, tok, path)
    return path


@pytest.mark.parametrize("task", list(TASKS))
def test_a_posbias_modernbert_checkpoint_is_not_exported_as_another_network(tmp_path, tok, task):
    """ModernBERT's HF task classes put a `head` (tagging) or need a `qa_outputs` (QA) that a posbias
    model trained on its encoder does not have: export refuses in one line instead of writing a
    folder with a random head."""
    ckpt = _modernbert_checkpoint(tmp_path / "ckpt", tok, task)
    expected = (r"ModernBertForTokenClassification puts its own `head`" if task == "tagging"
                else r"ModernBertForQuestionAnswering has no qa_outputs layer")
    with pytest.raises(ConfigError, match=expected) as e:
        posbias.export(ckpt, tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_export_runs_the_parity_check(tmp_path, tok, monkeypatch):
    """An exported task model that would score differently (here: a classifier off by a bias) is
    refused; the same check as on import, the other way round."""
    from posbias.tagging.model import build_model

    model = build_model(config_from("tiny_tagging").model, tok, ["O", "B-x", "I-x"], "iob2")
    save_checkpoint(model, config_from("tiny_tagging"), tok, tmp_path / "ckpt")
    monkeypatch.setattr(posbias.tagging.model, "TaggerModel", _off_by_a_bias(posbias.tagging.model.TaggerModel,
                                                                            ("logits",)))
    with pytest.raises(ConfigError, match=r"BertForTokenClassification would not reproduce this model's forward"):
        posbias.export(tmp_path / "ckpt", tmp_path / "out")
    monkeypatch.undo()
    out = posbias.export(tmp_path / "ckpt", tmp_path / "out")
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["architectures"] == ["BertForTokenClassification"]
