"""How an encoder uses positions is read from its config (`posbias.position_kind`), and
every position-shifting method refuses, by model type and config attribute, an encoder where
shifted ids move no word: Random Padding / RPP in training (API and CLI), shift mode of the
tagging diagnosis, and the `posbias.hf` collator."""
import warnings

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer, DataCollatorForTokenClassification, PretrainedConfig

import posbias
from posbias.config import RESOURCES, build_config, config_from
from posbias.encoders import encoder_from_config, position_kind
from posbias.errors import ConfigError
from posbias.perturb import build_perturbations
from posbias.perturb.position_shift import shift_effect
from posbias.tagging.model import TaggerModel

from helpers import cli_here

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
DEBERTA_RELATIVE = {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False}

# (model_type, config fields, kind, the attribute named, absolute input embeddings besides)
KINDS = {
    "bert": ("bert", {}, "absolute", "max_position_embeddings=512", False),
    "distilbert": ("distilbert", {}, "absolute", "max_position_embeddings=512", False),
    "distilbert-sinusoidal": ("distilbert", {"sinusoidal_pos_embds": True}, "absolute", "max_position_embeddings", False),
    "roberta": ("roberta", {}, "absolute", "max_position_embeddings=512", False),
    "electra": ("electra", {}, "absolute", "max_position_embeddings=512", False),
    "albert": ("albert", {}, "absolute", "max_position_embeddings=512", False),
    "gpt2": ("gpt2", {}, "absolute", "max_position_embeddings=1024", False),
    "bert-relative_key": ("bert", {"position_embedding_type": "relative_key"}, "relative",
                          "position_embedding_type='relative_key'", False),
    "bert-relative_key_query": ("bert", {"position_embedding_type": "relative_key_query"}, "relative",
                                "position_embedding_type='relative_key_query'", False),
    "modernbert": ("modernbert", {}, "rotary", "rope_parameters", False),
    "roformer": ("roformer", {}, "rotary", "rotary_value", False),
    "llama": ("llama", {}, "rotary", "rope_parameters", False),
    "esm": ("esm", {}, "absolute", "position_embedding_type='absolute'", False),  # rope_theta unused
    "esm-rotary": ("esm", {"position_embedding_type": "rotary"}, "rotary", "position_embedding_type='rotary'", False),
    # DeBERTa's own defaults are an absolute model; the released checkpoints' configs are relative.
    "deberta-default": ("deberta", {}, "absolute", "max_position_embeddings=512", False),
    "deberta": ("deberta", DEBERTA_RELATIVE, "relative", "relative_attention=True", False),
    "deberta-v2": ("deberta-v2", DEBERTA_RELATIVE, "relative", "relative_attention=True, position_biased_input=False",
                   False),
    "deberta-v2-biased-input": ("deberta-v2", {**DEBERTA_RELATIVE, "position_biased_input": True}, "relative",
                                "position_biased_input=True", True),
    "deberta-v2-no-positions": ("deberta-v2", {"position_biased_input": False}, "none", "position_biased_input=False",
                                False),
    "t5": ("t5", {}, "relative", "relative_attention_num_buckets=32", False),
    "mpnet": ("mpnet", {}, "relative", "relative_attention_num_buckets=32", True),
    "funnel": ("funnel", {}, "relative", "attention_type='relative_shift'", False),
    "bloom": ("bloom", {}, "none", "has no max_position_embeddings", False),
    "xlnet": ("xlnet", {}, "none", "max_position_embeddings=-1", False),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_position_kind_is_read_from_the_config(name):
    model_type, fields, kind, attribute, absolute_input = KINDS[name]
    found = position_kind(AutoConfig.for_model(model_type, **fields))
    assert (found.kind, found.absolute_input) == (kind, absolute_input)
    assert found.model_type == model_type and attribute in found.decided_by
    uses = "no position ids" if kind == "none" else f"{kind} positions"
    assert str(found).startswith(f"{model_type} uses {uses} (config ")


def test_a_model_type_posbias_has_never_seen_is_read_from_its_config_too():
    """No list of names: any config with rotary parameters is rotary, whatever its model_type
    (transformers 4.x's ModernBERT config.json said global_rope_theta)."""
    for key in ("global_rope_theta", "rope_theta", "rotary_emb_base"):
        found = position_kind(PretrainedConfig(**{key: 10000.0}, max_position_embeddings=128))
        assert found.kind == "rotary" and found.decided_by == key
    assert position_kind(PretrainedConfig(max_position_embeddings=128)).kind == "absolute"
    assert position_kind(PretrainedConfig(use_rope=False, max_position_embeddings=128)).kind == "absolute"
    alibi = position_kind(PretrainedConfig(alibi=True, rope_theta=10000.0))  # Falcon-style ALiBi
    assert (alibi.kind, alibi.decided_by) == ("none", "alibi=True")


@pytest.mark.parametrize("name", list(KINDS))
def test_shift_effect_follows_the_kind(name):
    model_type, fields, kind, _, absolute_input = KINDS[name]
    moves, why = shift_effect(AutoConfig.for_model(model_type, **fields))
    assert moves == (kind == "absolute" or absolute_input)
    assert (why is None) == (kind == "absolute")
    if why:
        assert why.startswith(str(position_kind(AutoConfig.for_model(model_type, **fields))) + ": ")
    assert shift_effect(AutoConfig.for_model(model_type, **fields), takes_position_ids=False)[0] is False


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))


# Encoders the training-time perturbations must refuse (a TaggerModel over each, random weights).
REFUSED = {
    "modernbert": ({**SMALL, "global_attn_every_n_layers": 2, "local_attention": 16}, "rope_parameters"),
    "roformer": (SMALL, "rotary_value"),
    "llama": ({**SMALL, "num_key_value_heads": 4}, "rope_parameters"),
    "deberta-v2": ({**SMALL, **DEBERTA_RELATIVE}, "relative_attention=True"),
    "bert": ({**SMALL, "position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
}


def tagger(model_type, fields, tok):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=tok.pad_token_id, **fields)
    return TaggerModel(encoder_from_config(config), ["O", "B-x", "I-x"], "iob2")


@pytest.mark.parametrize("method", ["rpp", "random_padding", "randomized_positions"])
@pytest.mark.parametrize("model_type", list(REFUSED))
def test_position_shifting_refuses_rotary_and_relative_encoders(tok, model_type, method):
    fields, attribute = REFUSED[model_type]
    cfg = build_config(config_from("tiny_tagging").to_dict() | {"perturb": [{"name": method}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with pytest.raises(ConfigError) as e:
        p.bind(tagger(model_type, fields, tok))
    msg = str(e.value)
    assert msg.startswith(f"perturb[0]: {model_type} uses ") and f"(config {attribute}" in msg and "\n" not in msg


def test_position_shifting_warns_where_the_input_embeddings_still_move(tok):
    """DeBERTa with position_biased_input adds absolute embeddings of the ids to its input: shifting
    moves those (not the distances its attention sees), so it trains, with a warning."""
    model = tagger("deberta-v2", {**SMALL, **DEBERTA_RELATIVE, "position_biased_input": True}, tok)
    cfg = build_config(config_from("tiny_tagging").to_dict() | {"perturb": [{"name": "rpp"}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p.bind(model)
    assert any("perturb[0]: deberta-v2 uses relative positions" in str(x.message)
               and "move only its absolute input embeddings" in str(x.message) for x in w)


def test_training_refuses_rpp_on_a_rotary_encoder_api_and_cli(tmp_path):
    overrides = ["model.encoder.model_type=roformer", "perturb=[{name: rpp}]", f"train.output_dir={tmp_path / 'run'}",
                 "data.max_train_examples=16", "data.max_eval_examples=8"]
    with pytest.raises(ConfigError, match=r"^perturb\[0\]: roformer uses rotary positions \(config rotary_value\)"):
        posbias.train(config_from("tiny_tagging", overrides), progress=False)
    r = cli_here("train", "tagging", "-c", "tiny_tagging", *overrides)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("posbias: error: perturb[0]: roformer uses rotary positions "
                                                 "(config rotary_value)")


@pytest.fixture(scope="module")
def modernbert_tagger_folder(tmp_path_factory, tok):
    from transformers import AutoModelForTokenClassification

    path = tmp_path_factory.mktemp("modernbert") / "hf"
    labels = ["O", "B-person", "I-person", "B-location", "I-location"]
    config = AutoConfig.for_model("modernbert", vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                  bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                                  cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                                  id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)},
                                  **REFUSED["modernbert"][0])
    torch.manual_seed(0)
    AutoModelForTokenClassification.from_config(config).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.mark.filterwarnings("ignore:.*cannot predict the data's entity types")
def test_shift_mode_skips_or_refuses_a_rotary_encoder(modernbert_tagger_folder, tmp_path):
    """No more "PSI 0.000" from shifting a RoPE model: shift mode is skipped with the reason beside
    duplicate mode, and refused when it is the only mode asked."""
    opts = {"k_max": 2, "quantiles": None, "overrides": ["data.max_eval_examples=8"], "progress": False}
    with pytest.raises(ConfigError, match=r"^shift mode cannot evaluate this model: modernbert uses rotary positions "
                                          r"\(config rope_parameters\)"):
        posbias.diagnose(modernbert_tagger_folder, "demo:wnut-dev", tmp_path / "d1", modes=("shift",), **opts)
    result = posbias.diagnose(modernbert_tagger_folder, "demo:wnut-dev", tmp_path / "d2", **opts)
    assert "by_alpha" in result["duplicate"]
    assert result["shift"]["skipped"].startswith("modernbert uses rotary positions (config rope_parameters)")


def hf_token_model(model_type, fields, tok):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    return AutoModelForTokenClassification.from_config(AutoConfig.for_model(
        model_type, vocab_size=len(tok), pad_token_id=tok.pad_token_id, num_labels=3, **fields))


@pytest.mark.parametrize("model_type", ["modernbert", "roformer", "llama", "deberta-v2"])
def test_the_position_shift_collator_refuses_rotary_and_relative_models(tok, model_type):
    from posbias.hf import PositionShiftCollator

    fields, attribute = REFUSED[model_type]
    model = hf_token_model(model_type, fields, tok)
    name = type(model).__name__
    with pytest.raises(ConfigError, match=rf"^{name}: {model_type} uses \w+ positions \(config {attribute}"):
        PositionShiftCollator(DataCollatorForTokenClassification(tok), model, tok)


def test_the_position_shift_collator_warns_or_accepts(tok):
    from posbias.hf import PositionShiftCollator

    biased = hf_token_model("deberta-v2", {**SMALL, **DEBERTA_RELATIVE, "position_biased_input": True}, tok)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        PositionShiftCollator(DataCollatorForTokenClassification(tok), biased, tok)
    assert any("move only its absolute input embeddings" in str(x.message) for x in w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an absolute model: no warning at all
        PositionShiftCollator(DataCollatorForTokenClassification(tok), hf_token_model("bert", SMALL, tok), tok)
