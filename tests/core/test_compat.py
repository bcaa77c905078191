"""`posbias.compat` (issue 45): config versions and their migration steps, the fields' compatibility
marks, and the config hash, which must stay what it was for every config: experiment stores
(docs/experiments) recorded their runs under it, and `experiment run` skips a finished run only when
its hash matches. The frozen values below were computed by the code before compat.py existed (the
seven tables it replaced); a changed value means recorded runs would be trained again."""
from __future__ import annotations

import hashlib
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from posbias import compat
from posbias.compat import CONFIG_VERSION, STEPS, _v0_to_v1, _v1_to_v2, config_version
from posbias.config import PRESETS, build_config, config_from, load_config, save_config
from posbias.errors import ConfigError
from posbias.perturb import perturbations_by_mode
from posbias.qa.config import QAConfig
from posbias.tagging.config import TaggingConfig

ROOT = Path(__file__).resolve().parents[2]
ARCHIVED = ROOT / "docs" / "experiments"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"

ENCODER = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 64, "max_position_embeddings": 512}
QA = {"model": {"name_or_path": None, "tokenizer": "tiny", "encoder": ENCODER},
      "data": {"train_file": "demo:train", "eval_file": "demo:dev", "max_seq_len": 128, "doc_stride": 48},
      "train": {"max_steps": 3, "output_dir": "runs/frozen"}}
TAGGING = {"task": "tagging", "model": {"name_or_path": None, "tokenizer": "tiny", "encoder": ENCODER},
           "data": {"train_file": "demo:wnut-train", "eval_file": "demo:wnut-dev", "max_seq_len": 64, "stride": 16},
           "train": {"max_steps": 3, "output_dir": "runs/frozen"}}
# QA as configs say it since config version 2: `data.stride` (QA's `data.doc_stride` before).
QA_NOW = {**QA, "data": {("stride" if k == "doc_stride" else k): v for k, v in QA["data"].items()}}
RPP, CP, RP = {"name": "rpp"}, {"name": "context_perturbation"}, {"name": "random_padding"}


def with_(base: dict, **sections) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in sections.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


# name -> (config dict, saved by posbias before versions), and the hash the code before issue 45 gave.
CASES = {
    "qa": (QA, False),
    "qa/saved": (QA, True),
    "qa/not-part-of-the-run": (with_(QA, train={"output_dir": "elsewhere", "device": "cpu",
                                                "report_to": ["tensorboard"], "eval_batch_tokens": None}), False),
    "qa/later-keys-at-neutral": (with_(QA, data={"train_subset": "first"}, model={"reinit_positions_from": None},
                                       train={"early_stopping_patience": None, "eval_precision": "fp32"}), False),
    "qa/train_subset-random": (with_(QA, data={"train_subset": "random", "max_train_examples": 8}), False),
    "qa/early-stopping": (with_(QA, train={"early_stopping_patience": 2}), False),
    "qa/eval_precision-bf16": (with_(QA, train={"eval_precision": "bf16"}), False),
    "qa/unanswerable-auto-saved": (with_(QA, data={"unanswerable_windows": "auto"}), True),
    "qa/dyref": (with_(QA, model={"head": "dynamic_query"}), False),
    "qa/dyref-saved": (with_(QA, model={"head": "dynamic_query"}), True),
    "qa/dyref-context": (with_(QA, model={"head": "dynamic_query", "softmax_over_default": "context"}), False),
    "qa/independent-all": (with_(QA, model={"softmax_over_default": "all"}), False),
    "qa/matrix": (with_(QA, model={"head": "matrix"}), False),
    "qa/random_padding": (with_(QA, perturb=[RP]), False),
    "qa/random_padding-saved": (with_(QA, perturb=[RP]), True),
    "qa/random_padding-augment": (with_(QA, perturb=[RP], data={"perturb_default_mode": "augment"}), False),
    "qa/rpp": (with_(QA, perturb=[RPP]), False),
    "qa/rpp-saved": (with_(QA, perturb=[RPP]), True),
    "qa/rpp-replace": (with_(QA, perturb=[{"name": "rpp", "mode": "replace"}]), False),
    "qa/no-perturb-replace": (with_(QA, data={"perturb_default_mode": "replace"}), False),
    # Config version 3 dropped the gate's bias term: a user's config without the key means the new
    # run (its hash moved); a checkpoint's config from before, or one that pins the bias, keeps the old one.
    "qa/debias-learned_mixin": (with_(QA, train={"debias": {"method": "learned_mixin"}}), False),
    "qa/debias-learned_mixin/saved": (with_(QA, train={"debias": {"method": "learned_mixin"}}), True),
    "qa/debias-learned_mixin-gate_bias": (with_(QA, train={"debias": {"method": "learned_mixin", "gate_bias": True}}),
                                          False),
    "qa/debias-token-log-explicit": (with_(QA, train={"debias": {"method": "bias_product", "prior": "token",
                                                                 "bias_term": "log"}}), False),
    "qa/debias-sentence": (with_(QA, train={"debias": {"method": "bias_product", "prior": "sentence"}}), False),
    "qa/debias-probability": (with_(QA, train={"debias": {"method": "bias_product",
                                                          "bias_term": "probability"}}), False),
    "qa/debias-entropy": (with_(QA, train={"debias": {"method": "entropy"}}), False),
    "tagging": (TAGGING, False),
    "tagging/saved": (TAGGING, True),
    "tagging/dstar": (with_(TAGGING, data={"length_quantiles": [0.25, 0.75]}), False),
    "tagging/dstar-saved": (with_(TAGGING, data={"length_quantiles": [0.25, 0.75]}), True),
    "tagging/dstar-split": (with_(TAGGING, data={"length_quantiles": [0.25, 0.75], "length_pool": "split"}), False),
    "tagging/pool-files": (with_(TAGGING, data={"length_quantiles": [0.15, 0.75],
                                                "length_pool_files": ["a.conll", "b.conll"]}), False),
    "tagging/later-keys-at-neutral": (with_(TAGGING, data={"label_map": None, "tags_column": None,
                                                           "length_pool_files": None, "train_subset": "first"},
                                            model={"reinit_positions_from": None}), False),
    "tagging/label_map": (with_(TAGGING, data={"label_map": {"person": "PER"}, "tags_column": "ner_tags"}), False),
    "tagging/rpp-cp": (with_(TAGGING, perturb=[RPP, CP]), False),
    "tagging/cp-rpp-saved": (with_(TAGGING, perturb=[CP, RPP]), True),
    "tagging/rpp-augment": (with_(TAGGING, perturb=[RPP], data={"perturb_default_mode": "augment"}), False),
    "tagging/not-part-of-the-run": (with_(TAGGING, train={"device": "cpu", "report_to": "tensorboard",
                                                          "eval_batch_tokens": 1024}), False),
    # Version 2 renamed QA's data.doc_stride (the name above) data.stride: the same run, the same hash.
    "qa/stride": (QA_NOW, False),
    "qa/stride-v2-saved": (with_(QA_NOW, config_version=2), True),
    "qa/doc_stride-v1-saved": (with_(QA, config_version=1), True),
}
FROZEN = {
    'qa': '84b513aaa8bdad68',
    'qa/saved': '84b513aaa8bdad68',
    'qa/not-part-of-the-run': '84b513aaa8bdad68',
    'qa/later-keys-at-neutral': '84b513aaa8bdad68',
    'qa/train_subset-random': 'efeb17162590d5cb',
    'qa/early-stopping': '550c24c6b789611f',
    'qa/eval_precision-bf16': '635ab5bede6f94ee',
    'qa/unanswerable-auto-saved': '3504d6041b40784f',
    'qa/dyref': '26206ff5dde446f3',
    'qa/dyref-saved': '5a2c4232a9b12d54',
    'qa/dyref-context': '5a2c4232a9b12d54',
    'qa/independent-all': '15032757314c1ec1',
    'qa/matrix': '5d74495a6d51cfce',
    'qa/random_padding': '8cd0d8231aed8b79',
    'qa/random_padding-saved': '5f8a86178b271b46',
    'qa/random_padding-augment': 'b8c2ba9256997f27',
    'qa/rpp': 'a1f07506aac9fc6a',
    'qa/rpp-saved': '8e49955ddc016d29',
    'qa/rpp-replace': 'dd452bfbf5bb67d4',
    'qa/no-perturb-replace': '84b513aaa8bdad68',
    'qa/debias-learned_mixin': '1ce18cb0b3f833aa',  # until version 3 (a gate with a bias): 154a6478bb7c39ed
    'qa/debias-learned_mixin/saved': '154a6478bb7c39ed',
    'qa/debias-learned_mixin-gate_bias': '154a6478bb7c39ed',
    'qa/debias-token-log-explicit': '0f277c72cc73613a',
    'qa/debias-sentence': '0f2bd50b81dc6c85',
    'qa/debias-probability': '098084ec6fae778a',
    'qa/debias-entropy': 'd7f7fdc6fbe57359',
    'tagging': '2b94ced0d890f7ef',
    'tagging/saved': '1e6c8016a24b5097',
    'tagging/dstar': '4c6d0a5f296a559f',
    'tagging/dstar-saved': 'cb9b344e066afe36',
    'tagging/dstar-split': 'cb9b344e066afe36',
    'tagging/pool-files': 'e55521ca08d42df6',
    'tagging/later-keys-at-neutral': '2b94ced0d890f7ef',
    'tagging/label_map': 'b51b310384c78910',
    'tagging/rpp-cp': '999c8c92a401e0e6',
    'tagging/cp-rpp-saved': '063f5e23fe224331',
    'tagging/rpp-augment': '62cd4b80ae6a9d57',
    'tagging/not-part-of-the-run': '2b94ced0d890f7ef',
    'qa/stride': '84b513aaa8bdad68',
    'qa/stride-v2-saved': '84b513aaa8bdad68',
    'qa/doc_stride-v1-saved': '84b513aaa8bdad68',
}
# Bundled presets, read as a user's configs.
FROZEN_PRESETS = {
    'conll2003_dstar_minilm': 'dad4067d7583d7c8',
    'conll2003_minilm': '26b5210d263bf510',
    'demo': '25813d705e3becbb',
    'quickstart': '6691a6321823f9ef',
    'squad_v1_minilm': 'de2aeab0f44902a2',
    'squad_v2_minilm': '0593469a6c02b42d',
    'tiny': '74e1b12bb6c22f69',
    'tiny_tagging': '5890f91480c66b22',
    'tweebank_pos_minilm': '6065033dc25f51f2',
    'ud_ewt_pos_dstar_minilm': '7960e267038ba343',
    'ud_ewt_pos_minilm': 'bfb5b5f465ee4b14',
    'wnut17_minilm': '48a127fef5be4718',
}
# Experiment specs (bundled, and each archived store's experiment.yaml): a digest of every run's
# name and config hash, as `experiment run` builds them today.
FROZEN_GRIDS = {
    'experiments/map_k_sweep': '1151ed7ec651a52c',
    'experiments/minilm_squad_small': '1a13b00c6a64d17b',
    'experiments/smoke': 'd3120beadb1b7863',
    'experiments/smoke_position_bias': '54c8e59a116fe896',
    'experiments/smoke_tagging': '4da5be53899f8a9b',
    'archived/dyref_fewshot': 'ac69622a658c8fad',
    'archived/dyref_fewshot_all_softmax': 'e0531e6e889bf5ca',
    'archived/dyref_full_cpu': '77179b21144fbc73',
    'archived/dyref_n512_all_softmax_probe': '2bc199a20a6af7af',
    'archived/first_sentence_stress': '8c4f466fde94c338',
    'archived/first_sentence_stress_gate': '8c4f466fde94c338',
    'archived/map_k_sweep': '1151ed7ec651a52c',
    'archived/map_e_forward': 'ca84b74ff47559d6',
    'archived/map_squad': 'f41a54c3ea759207',
    'archived/map_squad_bidaf': '07e80556498c1a08',
    'archived/map_squad_bidaf_4ep': '8efade3ddd4f0a31',
    'archived/minilm_squad_small': '1a13b00c6a64d17b',
    'archived/minilm_squad_small_n1000': '34a139f2f852ab8d',
    'archived/precision_parity_conll': '1789bee81b0a6845',
    'archived/precision_parity_demo': '7559e7b247fe6826',
    'archived/rp_squad_d50': 'af81d32515cc2acf',
    'archived/rp_squad_d50_3ep': '2c8bae6daf62a0f0',
    'archived/rp_squad_d50_bertpre': '8d9a3ebac8433248',
    'archived/tpb_conll_dstar': '5a997ea5d034c819',
    'archived/tpb_conll_authors': '8175471157230485',  # seeds 4-5 joined the store: 15 runs
    'archived/tpb_ewt_authors': '79ee53686d711d72',  # seeds 4-5 joined the store: 15 runs
    'archived/first_sentence_alpha': 'af52ee9806af4742',
    'archived/tpb_ewt_dstar': 'c7a9a0790bada5e9',
    'archived/rp_full': '9cebc6571332e779',
    'archived/tpb_conll_full': 'f4afbac2b21df24c',
    'archived/rp_squad_d50_3ep_reinit': 'f936e0cf25ca3f11',  # the capped, augment and lr 3e-5 arms joined the spec
    'archived/tpb_conll_authors_reinit': '9aa3f6a65963903e',
    'archived/tpb_conll_authors_reinit_copies': '9aa3f6a65963903e',  # the same spec: baseline and CP re-run with per-copy scores
}
# Finished runs of each archived store that `experiment run docs/experiments/<name>/experiment.yaml`
# skips (spec's hash == recorded hash), of the finished runs the store holds. The others were
# recorded before issue 29 changed their defaults and train again, as they did before issue 45.
SKIPPED = {
    "dyref_fewshot": (0, 36), "dyref_fewshot_all_softmax": (18, 18), "dyref_n512_all_softmax_probe": (3, 3),
    "first_sentence_stress": (57, 57), "first_sentence_stress_gate": (2, 2), "map_k_sweep": (0, 15),
    "map_squad": (0, 12), "map_squad_bidaf": (0, 4), "map_squad_bidaf_4ep": (0, 9),
    "precision_parity_conll": (6, 6), "precision_parity_demo": (6, 6), "rp_squad_d50_bertpre": (6, 6),
    "tpb_conll_authors": (15, 15), "tpb_ewt_authors": (15, 15), "first_sentence_alpha": (6, 6),
    "rp_full": (2, 2), "tpb_conll_full": (2, 2), "rp_squad_d50": (9, 9), "rp_squad_d50_3ep": (6, 6),
    "dyref_full_cpu": (2, 2), "rp_squad_d50_3ep_reinit": (12, 12), "tpb_conll_authors_reinit": (9, 9),
    "tpb_conll_authors_reinit_copies": (6, 6),
    "map_e_forward": (3, 6),  # its map_e_forward runs name their checkpoint by path ({output_dir}), part of their hash
}


# The frozen inputs spell QA's stride as recorded runs did (data.doc_stride): read with a FutureWarning.
OLD_STRIDE_NAME = "ignore:.*data.doc_stride is deprecated:FutureWarning"


@pytest.mark.filterwarnings(OLD_STRIDE_NAME)
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_hash_of_every_config_is_the_one_before_versions(name):
    d, saved = CASES[name]
    assert build_config(d, saved=saved).hash() == FROZEN[name]


def test_every_preset_keeps_its_hash():
    assert {p.stem: load_config(p).hash() for p in sorted(PRESETS.glob("*.yaml"))} == FROZEN_PRESETS


def _grid_digest(spec) -> str:
    from posbias.experiment import load_experiment

    exp = load_experiment(str(spec), output_dir="runs/frozen")
    return hashlib.sha256("\n".join(f"{r.name} {r.config_hash}" for r in exp.runs).encode()).hexdigest()[:16]


@pytest.mark.filterwarnings(OLD_STRIDE_NAME)
def test_every_experiment_spec_builds_the_same_run_hashes():
    specs = {f"experiments/{p.stem}": p for p in sorted((PRESETS / "experiments").glob("*.yaml"))}
    specs |= {f"archived/{p.parent.name}": p for p in sorted(ARCHIVED.glob("*/experiment.yaml"))}
    assert {name: _grid_digest(p) for name, p in specs.items()} == FROZEN_GRIDS


@pytest.mark.filterwarnings(OLD_STRIDE_NAME)
def test_experiment_run_still_skips_the_archived_finished_runs():
    """What `experiment run` decides per run (`run_status`: finished under the same hash = skipped),
    on each archived store, read-only."""
    from posbias.experiment import load_experiment, run_status

    found = {}
    for db in sorted(ARCHIVED.glob("*/experiment.sqlite")):
        if not (db.parent / "experiment.yaml").is_file():
            continue
        exp = load_experiment(str(db.parent / "experiment.yaml"), output_dir="runs/frozen")
        with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
            status = [(run, *run_status(con, run.name)) for run in exp.runs]
        finished = [(run, h) for run, s, h in status if s == "finished"]
        found[db.parent.name] = (sum(h == run.config_hash for run, h in finished), len(finished))
    assert found == SKIPPED


# -- the marks replace the old tables -------------------------------------------------------------

def test_the_marks_declare_what_the_old_tables_listed():
    """HASH_NEUTRAL_DEFAULTS, SAVED_BEFORE_KEY's hash part, the pops in RunConfig.hash(),
    QAConfig.to_dict's dropped keys and training's RESUMABLE_CHANGES, now the fields' marks."""
    train_never = {"train.output_dir", "train.device", "train.report_to", "train.eval_batch_tokens",
                   "train.deterministic"}
    later = {"data.train_subset": "first", "train.early_stopping_patience": None, "train.eval_precision": "fp32",
             "data.perturb_default_mode": "replace", "model.reinit_positions_from": None}
    assert compat.not_hashed(QAConfig) == compat.not_hashed(TaggingConfig) == train_never
    assert compat.hash_neutral(QAConfig) == later | {"model.softmax_over_default": "context", "train.debias": None,
                                                     "train.debias.prior": "token", "train.debias.bias_term": "log",
                                                     "train.debias.gate_bias": (None, True)}
    assert compat.hash_neutral(TaggingConfig) == later | {"data.label_map": None, "data.tags_column": None,
                                                          "data.length_pool_files": None, "data.length_pool": "split"}
    resumable = {"epochs", "max_steps", "eval_every", "log_every", "save_every", "output_dir", "eval_precision",
                 "num_threads", "eval_batch_size", "eval_batch_tokens", "device", "report_to", "deterministic"}
    assert compat.resumable_keys(QAConfig) == compat.resumable_keys(TaggingConfig) == {f"train.{k}" for k in resumable}


def test_omitted_keys_stay_out_of_the_written_config_at_their_neutral_value():
    off = build_config(QA_NOW).to_dict()
    assert "debias" not in off["train"]
    on = build_config(with_(QA_NOW, train={"debias": {"method": "bias_product"}})).to_dict()["train"]["debias"]
    assert on["method"] == "bias_product" and "prior" not in on and "bias_term" not in on
    sentence = build_config(with_(QA_NOW, train={"debias": {"method": "bias_product", "prior": "sentence"}}))
    assert sentence.to_dict()["train"]["debias"]["prior"] == "sentence"
    with pytest.raises(ValueError, match="neutral"):
        compat.marks(omit=True)


# -- versions -------------------------------------------------------------------------------------

def test_every_step_is_named_for_its_versions_and_tested_here():
    here = sys.modules[__name__]
    for version, step in enumerate(STEPS):
        assert step.__name__ == f"_v{version}_to_v{version + 1}"
        assert callable(getattr(here, f"test{step.__name__}", None)), f"test{step.__name__} missing"
    assert CONFIG_VERSION == len(STEPS)


def test_v0_to_v1():
    """Issue 29's keys get the values configs without them meant; set values stay; only qa and
    tagging configs have them; a missing section gets one."""
    qa = {"task": "qa", "model": {"head": "dynamic_query"}, "data": {"train_file": "x"}}
    assert _v0_to_v1(dict(qa), "qa") == {
        "task": "qa", "model": {"head": "dynamic_query", "softmax_over_default": "context"},
        "data": {"train_file": "x", "perturb_default_mode": "replace"}}
    assert qa["model"] == {"head": "dynamic_query"}  # the sections are copied, not changed
    tagging = {"task": "tagging", "data": {"length_pool": "pooled"}}
    assert _v0_to_v1(dict(tagging), "tagging") == {
        "task": "tagging", "data": {"length_pool": "pooled", "perturb_default_mode": "replace"}}
    assert _v0_to_v1({}, "tagging") == {"data": {"perturb_default_mode": "replace", "length_pool": "split"}}
    set_ = {"model": {"softmax_over_default": "all"}, "data": {"perturb_default_mode": "paper"}}
    assert _v0_to_v1(dict(set_), "qa") == set_
    assert _v0_to_v1({"data": {}}, "other") == {"data": {}}


def test_v1_to_v2():
    """QA's data.doc_stride is renamed data.stride in its place (the written order stays); tagging
    (always `stride`) and other tasks are left alone; both names at once are refused."""
    qa = {"task": "qa", "data": {"max_seq_len": 128, "doc_stride": 48, "max_query_len": 32}}
    out = _v1_to_v2(dict(qa), "qa")
    assert out == {"task": "qa", "data": {"max_seq_len": 128, "stride": 48, "max_query_len": 32}}
    assert list(out["data"]) == ["max_seq_len", "stride", "max_query_len"]
    assert qa["data"] == {"max_seq_len": 128, "doc_stride": 48, "max_query_len": 32}  # copied, not changed
    assert _v1_to_v2({"data": {"stride": 48}}, "qa") == {"data": {"stride": 48}}
    assert _v1_to_v2({}, "qa") == {} and _v1_to_v2({"data": None}, "qa") == {"data": None}
    assert _v1_to_v2({"data": {"doc_stride": 1}}, "tagging") == {"data": {"doc_stride": 1}}  # not tagging's key
    with pytest.raises(ConfigError, match=r"^data.doc_stride and data.stride are both set: .*keep data.stride$"):
        _v1_to_v2({"data": {"doc_stride": 48, "stride": 64}}, "qa")


def test_v2_to_v3():
    """A QA learned-mixin config from before version 3 had a bias term in its gate: it gets
    `gate_bias: true`; one that sets the key, other de-biasing methods, no debias and tagging are left
    alone. The built models: a gate with a bias from before, none for a user's config now."""
    import json
    from types import SimpleNamespace

    from posbias.compat import _v2_to_v3
    from posbias.qa.debias import make_debias

    encoder = SimpleNamespace(config=SimpleNamespace(hidden_size=32))

    old = {"task": "qa", "train": {"lr": 1e-4, "debias": {"method": "learned_mixin_h", "entropy_weight": 0.4}}}
    out = _v2_to_v3(json.loads(json.dumps(old)), "qa")
    assert out["train"]["debias"] == {"method": "learned_mixin_h", "entropy_weight": 0.4, "gate_bias": True}
    assert out["train"]["lr"] == 1e-4
    kept = {"train": {"debias": {"method": "learned_mixin", "gate_bias": False}}}
    assert _v2_to_v3(json.loads(json.dumps(kept)), "qa") == kept
    for same in ({"train": {"debias": {"method": "bias_product"}}}, {"train": {"debias": None}}, {"train": {}}, {}):
        assert _v2_to_v3(json.loads(json.dumps(same)), "qa") == same
    assert _v2_to_v3(json.loads(json.dumps(old)), "tagging") == old
    saved = build_config(with_(QA, train={"debias": {"method": "learned_mixin"}}), saved=True)
    new = build_config(with_(QA, train={"debias": {"method": "learned_mixin"}}), saved=False)
    assert (saved.train.debias.gate_bias, new.train.debias.gate_bias) == (True, False)
    assert make_debias(saved.train.debias, "independent", encoder).gate.bias is not None
    assert make_debias(new.train.debias, "independent", encoder).gate.bias is None
    with pytest.raises(ConfigError, match=r"^train.debias.gate_bias is read by learned_mixin and learned_mixin_h only"):
        build_config(with_(QA, train={"debias": {"method": "bias_product", "gate_bias": True}}))


def test_the_old_stride_name_in_a_saved_config_is_renamed_without_a_warning(tmp_path):
    """A checkpoint's posbias.yaml of version 0 or 1 says data.doc_stride: read as data.stride, the
    same hash, no warning (the user did not write it); written again it says stride, version 2."""
    import warnings

    for version in (None, 1):
        d = QA if version is None else with_(QA, config_version=version)
        (tmp_path / "posbias.yaml").write_text(yaml.safe_dump(d), encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cfg = load_config(tmp_path / "posbias.yaml", saved=True)
        assert cfg.data.stride == 48 and cfg.hash() == FROZEN["qa"]
        written = cfg.to_dict()
        assert written["config_version"] == CONFIG_VERSION == 3
        assert written["data"]["stride"] == 48 and "doc_stride" not in written["data"]


def test_the_old_stride_name_in_a_users_config_is_read_with_a_warning(tmp_path):
    """A user's YAML or override that still says data.doc_stride: read as data.stride with a
    FutureWarning naming both (and the file); the hash is the one recorded runs have. An override
    with the old name beats the preset's new one; both names in one mapping are a ConfigError."""
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(QA), encoding="utf-8")
    with pytest.warns(FutureWarning, match=rf"^{path}: data.doc_stride is deprecated: the old name of "
                                           r"data.stride, read as it; write data.stride$"):
        cfg = load_config(path)
    assert cfg.data.stride == 48 and cfg.hash() == build_config(QA_NOW).hash() == FROZEN["qa"]
    with pytest.warns(FutureWarning, match=r"^override data.doc_stride is deprecated"):
        over = config_from("tiny", ["data.doc_stride=32"])
    assert over.data.stride == 32 and config_from("tiny").data.stride == 64  # the preset says stride: 64
    assert over == config_from("tiny", ["data.stride=32"])
    with pytest.raises(ConfigError, match=r"^data.doc_stride and data.stride are both set: data.doc_stride is "
                                          r"the old name of data.stride; keep data.stride$"):
        build_config(with_(QA, data={"stride": 64}))
    with pytest.raises(ConfigError, match="^unknown config key data.doc_stride"):  # tagging never had it
        build_config(with_(TAGGING, data={"doc_stride": 16}))


def test_the_old_stride_name_in_an_experiment_spec_overrides_its_base(tmp_path):
    """An experiment spec's parts are read under today's names before they are merged: an archived
    spec's `overrides: {data: {doc_stride: 96}}` over `base: demo` (now `stride: 128`) gives 96."""
    from posbias.experiment import load_experiment

    spec = {"name": "s", "base": "demo", "methods": {"a": {}, "b": {"data": {"doc_stride": 32}}}, "seeds": [1],
            "overrides": {"data": {"max_seq_len": 256, "doc_stride": 96}}}
    with pytest.warns(FutureWarning) as caught:
        exp = load_experiment(spec, output_dir=str(tmp_path))
    assert {str(w.message).split(" is deprecated")[0] for w in caught} == {"overrides.data.doc_stride",
                                                                           "methods.b.data.doc_stride"}
    assert [r.config.data.stride for r in exp.runs] == [96, 32]
    now = load_experiment({**spec, "overrides": {"data": {"max_seq_len": 256, "stride": 96}}, "methods": {"a": {}}},
                          output_dir=str(tmp_path))
    assert exp.runs[0].config_hash == now.runs[0].config_hash


def test_a_renamed_key_enters_the_hash_under_its_old_name():
    """The `old_name` mark: QA's hash sees data.doc_stride, as before version 2; tagging's data.stride."""
    assert compat._marked(QAConfig, "old_name") == {"data.stride": "doc_stride"}
    assert compat._marked(TaggingConfig, "old_name") == {}
    qa, tagging = compat.hashed_form(build_config(QA_NOW)), compat.hashed_form(build_config(TAGGING))
    assert qa["data"]["doc_stride"] == 48 and "stride" not in qa["data"]
    assert tagging["data"]["stride"] == 16 and "doc_stride" not in tagging["data"]
    assert build_config(QA_NOW).to_dict()["data"]["stride"] == 48  # written under the new name


def test_the_version_of_a_config_without_one_depends_on_who_wrote_it():
    assert config_version({}, saved=True) == 0  # a checkpoint's, a recorded run's: before versions
    assert config_version({}, saved=False) == CONFIG_VERSION  # a user's own: users write no versions
    assert config_version({"config_version": 0}, saved=False) == 0
    assert config_version({"config_version": CONFIG_VERSION}, saved=True) == CONFIG_VERSION
    d = {"config_version": 0, "task": "qa", "data": {}}
    assert compat.migrate(d, task="qa")["data"]["perturb_default_mode"] == "replace" and "config_version" in d
    assert "config_version" not in compat.migrate({"config_version": CONFIG_VERSION}, task="qa")


def test_a_newer_or_bad_version_is_one_line_naming_the_file_and_the_key(tmp_path):
    path = tmp_path / "posbias.yaml"
    path.write_text(f"config_version: {CONFIG_VERSION + 1}\ntask: qa\n", encoding="utf-8")
    for saved in (False, True):
        with pytest.raises(ConfigError) as e:
            load_config(path, saved=saved)
        msg = str(e.value)
        assert msg.startswith(f"{path}: config_version {CONFIG_VERSION + 1} is newer than this posbias reads "
                              f"({CONFIG_VERSION})") and "upgrade posbias" in msg and "\n" not in msg
    for bad in ("-1", "true", "1.5", "'1'"):
        path.write_text(f"config_version: {bad}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=rf"^{path}: config_version must be a whole number from 0 to "):
            load_config(path)
    with pytest.raises(ConfigError, match="^override config_version: not a setting"):
        build_config(QA_NOW, ["config_version=0"])


def test_configs_posbias_writes_carry_the_version_and_read_back_unchanged(tmp_path):
    """save_config writes `config_version` first; read back as a saved config (a checkpoint's), a
    config written today is not migrated: a DyReF run keeps `all`, an RPP run `paper` (augment)."""
    for d in (with_(QA_NOW, model={"head": "dynamic_query"}, perturb=[RPP]),
              with_(TAGGING, data={"length_quantiles": [0.25, 0.75]}, perturb=[RPP])):
        cfg = build_config(d)
        save_config(cfg, tmp_path / "posbias.yaml")
        text = (tmp_path / "posbias.yaml").read_text(encoding="utf-8")
        assert text.startswith(f"config_version: {CONFIG_VERSION}\n")
        again = load_config(tmp_path / "posbias.yaml", saved=True)
        assert again == cfg and again.hash() == cfg.hash() and again.to_dict() == cfg.to_dict()
        assert again.data.perturb_default_mode == "paper"
        assert [len(x) for x in perturbations_by_mode(again.perturb, again)] == [0, 1]  # augment
    assert again.data.length_pool == "pooled"
    assert build_config(cfg.to_dict(), saved=True).hash() == cfg.hash()  # an experiment store's record


def test_resuming_allows_the_resumable_keys_only(tmp_path):
    """training._check_resume reads the fields marked `resumable` (was RESUMABLE_CHANGES)."""
    from posbias.training import _check_resume

    for base in (QA_NOW, TAGGING):
        cfg = build_config(base)
        save_config(cfg, tmp_path / "posbias.yaml")
        _check_resume(build_config(base, ["train.epochs=3", "train.output_dir=elsewhere", "train.device=cpu",
                                          "train.eval_batch_tokens=null", "train.eval_precision=bf16"]), tmp_path)
        for change in ("train.lr=0.5", "train.seed=1", "data.max_seq_len=120"):
            with pytest.raises(ConfigError, match=rf"^cannot resume from {tmp_path}: {change.split('=')[0]} changed"):
                _check_resume(build_config(base, [change]), tmp_path)


# -- old checkpoints ------------------------------------------------------------------------------

@pytest.mark.filterwarnings(OLD_STRIDE_NAME)
def test_an_old_qa_checkpoint_loads_with_its_old_behaviour(tokenizer, tmp_path):
    """A checkpoint whose posbias.yaml predates versions (the fixture) keeps the context-only DyReF
    softmax and replace-mode perturbations, and its hash; the same YAML as a user's config is today's."""
    from posbias.checkpoint import load_checkpoint, save_checkpoint
    from posbias.qa.model import build_model

    fixture = FIXTURES / "qa_before_versions.yaml"
    assert "config_version" not in yaml.safe_load(fixture.read_text(encoding="utf-8"))
    new = load_config(fixture)
    assert new.model.softmax_over_default == "all" and new.data.perturb_default_mode == "paper"
    save_checkpoint(build_model(new.model, tokenizer, null_answer=False), new, tokenizer, tmp_path / "old")
    (tmp_path / "old" / "posbias.yaml").write_bytes(fixture.read_bytes())
    model, _, cfg = load_checkpoint(tmp_path / "old", task="qa")
    assert model.head.softmax_over == "context" and cfg.model.softmax_over_default == "context"
    assert cfg.data.perturb_default_mode == "replace"
    assert [len(x) for x in perturbations_by_mode(cfg.perturb, cfg)] == [1, 0]  # RPP replaces the batch
    assert cfg.hash() == "44c86aa89fcf080e" != new.hash()  # as computed before issue 45
    assert cfg.to_dict()["config_version"] == CONFIG_VERSION  # written again, it says what it means


def test_an_old_tagging_checkpoint_config_keeps_its_old_behaviour():
    fixture = FIXTURES / "tagging_before_versions.yaml"
    old = load_config(fixture, saved=True)
    assert old.data.length_pool == "split" and old.data.perturb_default_mode == "replace"
    assert [len(x) for x in perturbations_by_mode(old.perturb, old)] == [1, 0]
    assert old.hash() == "d9852f9b29304e64"  # as computed before issue 45
    new = load_config(fixture)
    assert new.data.length_pool == "pooled" and new.data.perturb_default_mode == "paper"
    assert new.hash() == "a6b48cf33c0fa8f0"

