"""posbias.errors.did_you_mean, and every "unknown key / option / name" error that uses it: a
misspelled key names the closest valid one; a key nothing resembles lists the valid ones."""
import pytest
import yaml

from posbias.config import PRESETS, build_config, config_from, dotted_keys, load_config
from posbias.errors import ConfigError, did_you_mean
from posbias.experiment import load_experiment
from posbias.qa.config import QAConfig

from helpers import cli_here, tiny_config


def test_did_you_mean():
    assert did_you_mean("lrr", ["lr", "seed", "epochs"], prefix="train.") == "; did you mean train.lr?"
    assert did_you_mean("LR", ["lr", "seed"]) == "; did you mean lr?"  # case does not count
    assert did_you_mean("bioe", ["iob2", "bioes"], quote=True) == "; did you mean 'bioes'?"
    assert did_you_mean("zzzz", ["lr", "seed"]) == ""  # nothing close: no guess
    assert did_you_mean(3, ["lr"]) == "" and did_you_mean("lr", []) == ""


def test_dotted_keys_cover_every_section():
    keys = dotted_keys(QAConfig)
    assert {"train", "train.lr", "data.max_seq_len", "decode.n_best", "model.head_options"} <= set(keys)


@pytest.mark.parametrize("overrides, message", [
    (["train.lrr=1e-4"], "unknown config key train.lrr; did you mean train.lr?"),
    (["train.LR=1e-4"], "unknown config key train.LR; did you mean train.lr?"),
    (["data.max_seqlen=128"], "unknown config key data.max_seqlen; did you mean data.max_seq_len?"),
    (["trian.lr=1"], "unknown config key trian; did you mean train?"),
    (["data.lr=1"], "unknown config key data.lr; did you mean train.lr?"),  # the right key, the wrong section
    (["lr=1"], "unknown config key lr; did you mean train.lr?"),
    (["decode.nbest=5"], "unknown config key decode.nbest; did you mean decode.n_best?"),
    (["train.debias={methd: entropy}"], "unknown config key train.debias.methd; did you mean train.debias.method?"),
    (["model.head=independant"], "model.head: unknown head 'independant'; did you mean 'independent'?"),
    (["model.head_options.softmax_ovr=all"],
     "model.head_options: unknown option 'softmax_ovr' for head 'independent'; did you mean "
     "model.head_options.softmax_over?"),
    (["model.head=matrix", "model.head_options.directon=forward"], "did you mean model.head_options.direction?"),
    (["data.on_bad_record=skipp"], "data.on_bad_record must be one of ['error', 'skip'], got 'skipp'; "
                                   "did you mean 'skip'?"),
    (["train.report_to=tensorbord"], "train.report_to: unknown tracker 'tensorbord'; did you mean 'tensorboard'?"),
    (["perturb=[{name: random_paddin}]"], "perturb[0].name: unknown perturbation 'random_paddin'; did you mean "
                                          "'random_padding'?"),
    (["perturb=[{name: random_padding, max_lne: 3}]"], "perturb[0]: unknown option 'max_lne' for random_padding; "
                                                        "did you mean perturb[0].max_len?"),
])
def test_a_misspelled_qa_key_names_the_closest(overrides, message):
    with pytest.raises(ConfigError) as e:
        build_config(tiny_config(), overrides)
    assert str(e.value) == message or str(e.value).endswith(message), str(e.value)


@pytest.mark.parametrize("overrides, message", [
    (["data.tag_colum=2"], "unknown config key data.tag_colum; did you mean data.tag_column?"),
    (["data.label_scheme=bioess"], "did you mean 'bioes'?"),
    (["model.head_options.dropuot=0.1"], "did you mean model.head_options.dropout?"),
    (["perturb=[{name: context_perturbation, maxlen: 64}]"], "did you mean perturb[0].max_len?"),
])
def test_a_misspelled_tagging_key_names_the_closest(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("?", r"\?").replace("[", r"\[")):
        config_from("tiny_tagging", overrides)


@pytest.mark.parametrize("overrides", [["train.zzzz=1"], ["model.head_options.qqq=1"], ["model.head=xyzzy"]])
def test_a_key_nothing_resembles_lists_the_valid_ones(overrides):
    with pytest.raises(ConfigError) as e:
        build_config(tiny_config(), overrides)
    assert "did you mean" not in str(e.value)
    assert any(w in str(e.value) for w in ("known keys here: [", "it takes softmax_over", "choose one of ["))


def test_correct_keys_and_presets_get_no_complaint():
    build_config(tiny_config(), ["train.lr=1e-4", "data.max_seq_len=128", "decode.n_best=5"])
    config_from("tiny_tagging", ["data.tag_column=2", "model.head_options.dropout=0.1"])


def test_a_misspelled_key_in_a_yaml_preset(tmp_path):
    d = yaml.safe_load((PRESETS / "tiny.yaml").read_text(encoding="utf-8"))
    d["train"]["warmup_ration"] = 0.1
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^unknown config key train\.warmup_ration; did you mean train\.warmup_ratio\?$"):
        load_config(str(path))


@pytest.mark.parametrize("change, message", [
    ({"method": {"m": {}}}, "experiment spec: unknown key 'method'; did you mean 'methods'?"),
    ({"methods": {"m": {"train": {"lrr": 1}}}}, "experiment run m/seed1: unknown config key train.lrr; did you mean "
                                                 "train.lr?"),
    ({"segments": [{"name": "answer_lenght"}]}, "segments[0].name: unknown segmenter 'answer_lenght'; did you mean "
                                                 "'answer_length'?"),
    ({"segments": [{"name": "answer_length", "edge": [1, 2]}]}, "segments[0].edge: unknown option of answer_length; "
                                                                 "did you mean segments[0].edges?"),
])
def test_a_misspelled_experiment_key_names_the_closest(tmp_path, change, message):
    spec = yaml.safe_load((PRESETS / "experiments" / "smoke.yaml").read_text(encoding="utf-8"))
    spec.update(change, output_dir=str(tmp_path / "exp"))
    with pytest.raises(ConfigError) as e:
        load_experiment(spec)
    assert str(e.value).endswith(message), str(e.value)


def test_cli_exits_2_with_one_line_naming_the_closest_key(tmp_path):
    r = cli_here("train", "qa", "-c", "tiny", "train.lrr=1e-4", f"train.output_dir={tmp_path / 'run'}")
    assert r.returncode == 2 and r.stderr == "posbias: error: unknown config key train.lrr; did you mean train.lr?\n"
