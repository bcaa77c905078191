import pytest

from posbias.api import load_config
from posbias.config import PRESETS, build_config, parse_overrides
from posbias.errors import ConfigError

PRESET_FILES = sorted(PRESETS.glob("*.yaml"))


def test_presets_exist():
    assert {p.stem for p in PRESET_FILES} >= {"demo", "tiny", "squad_v1_minilm", "squad_v2_minilm"}


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_every_preset_validates(path):
    cfg = load_config(str(path))
    assert cfg.task in ("qa", "tagging")
    assert load_config(path.stem) == cfg  # by name too


def test_overrides_are_parsed_as_yaml():
    assert parse_overrides(["data.max_seq_len=256", "model.head=independent", "train.max_steps=null"]) == {
        "data": {"max_seq_len": 256}, "model": {"head": "independent"}, "train": {"max_steps": None}}
    # YAML 1.1 reads "1e-4" as a string; float fields still accept it.
    cfg = load_config("tiny", ["train.lr=3e-5", "train.epochs=2"])
    assert cfg.train.lr == 3e-5 and cfg.train.epochs == 2.0


@pytest.mark.parametrize("override, key", [
    (["train.lrr=1"], "train.lrr"),
    (["nonsense=1"], "nonsense"),
    (["data.max_seq_len=abc"], "data.max_seq_len"),
    (["model.head=nope"], "model.head"),
    (["data.stride=500"], "data.stride"),
    (["data.on_bad_record=ignore"], "data.on_bad_record"),
    (["train.batch_size=0"], "train.batch_size"),
    (["perturb=[{name: no_such_thing}]"], "perturb[0].name"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", override)
    assert key in str(e.value)


def test_override_needs_equals():
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["train.lr"])


def test_hash_ignores_output_dir_only():
    a = build_config({"train": {"output_dir": "x"}})
    b = build_config({"train": {"output_dir": "y"}})
    c = build_config({"train": {"output_dir": "y", "seed": 1}})
    assert a.hash() == b.hash() != c.hash()


def test_train_subset_random_draws_per_seed_and_first_keeps_file_order():
    from posbias.training import train_subset

    items = list(range(100))
    assert train_subset(items, 10, "first", 1) == list(range(10))
    a, b = train_subset(items, 10, "random", 1), train_subset(items, 10, "random", 2)
    assert a == sorted(a) and len(set(a)) == 10 and a != b and a == train_subset(items, 10, "random", 1)
    assert train_subset(items, None, "random", 1) == items and train_subset(items, 500, "random", 1) == items


def test_a_key_at_its_neutral_default_leaves_the_hash_unchanged():
    """Experiments recorded before `data.train_subset` existed keep their config hashes."""
    from posbias.config import build_config

    from helpers import tiny_config

    first = build_config(tiny_config())
    assert "train_subset" in first.to_dict()["data"]
    d = first.to_dict()
    del d["data"]["train_subset"]
    import hashlib
    import json

    # Keys that never enter the hash (the version of the written form, where a run is written, runs,
    # reports) and later keys at their neutral defaults.
    del d["config_version"]
    for key in ("output_dir", "device", "report_to", "early_stopping_patience", "eval_batch_tokens",
                "eval_precision", "deterministic"):
        d["train"].pop(key, None)
    d["model"].pop("softmax_over_default")  # `context` for every head but DyReF: the value saved configs read
    d["model"].pop("reinit_positions_from")  # None: the weights as loaded, as before the key
    d["data"].pop("perturb_default_mode")  # left out of the hash when there are no perturbations
    d["data"]["doc_stride"] = d["data"].pop("stride")  # QA's hash keeps the name before config version 2
    assert first.hash() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    assert build_config(tiny_config(data={"train_subset": "random"})).hash() != first.hash()
    with pytest.raises(ConfigError, match="data.train_subset"):
        build_config(tiny_config(data={"train_subset": "shuffled"}))


def test_archived_experiment_runs_keep_their_config_hashes():
    """Every run archived in docs/experiments rebuilds to the hash it was recorded under: keys added
    since (device, trackers, early stopping, label maps) must not turn recorded runs into 'changed'."""
    import json
    import sqlite3
    from contextlib import closing
    from pathlib import Path

    from posbias.config import build_config

    import yaml

    dbs = sorted((Path(__file__).resolve().parents[2] / "docs" / "experiments").glob("*/experiment.sqlite"))
    assert dbs
    checked = 0
    for db in dbs:
        spec = yaml.safe_load((db.parent / "experiment.yaml").read_text(encoding="utf-8"))
        # a `checkpoint:` method's runs are recorded under a hash that also names their model's path
        # (`experiment.spec.Run.hash`): test_compat's SKIPPED states what they resume as
        methods = spec.get("methods") or {}
        scored = {m for m, over in methods.items() if isinstance(over, dict) and "checkpoint" in over}
        with closing(sqlite3.connect(str(db))) as con:
            rows = con.execute("SELECT name, method, config_hash, config_json FROM runs")
            for name, method, recorded, config_json in rows:
                if method in scored:
                    continue
                assert build_config(json.loads(config_json), saved=True).hash() == recorded, f"{db.parent.name}/{name}"
                checked += 1
    assert checked >= 50


SHARED_DATA_KEYS = {"train_file", "eval_file", "max_seq_len", "stride", "on_bad_record", "max_train_examples",
                    "train_subset", "max_eval_examples", "perturb_default_mode"}


@pytest.mark.parametrize("task, defaults", [("qa", {"max_seq_len": 384, "stride": 128}),
                                            ("tagging", {"max_seq_len": 256, "stride": 64})])
def test_the_data_keys_every_task_has_are_declared_once(task, defaults):
    """`posbias.config.DataConfig` declares the data keys both tasks have (type, range, marks,
    docstring); a task's data section subclasses it and declares none of them again (its own default
    or old name of a shared key goes in its class line), so the two cannot drift apart again."""
    import ast
    import dataclasses
    import inspect
    import textwrap
    from typing import get_type_hints

    from posbias.config import DataConfig
    from posbias.tasks import get_task

    shared = {f.name: f for f in dataclasses.fields(DataConfig)}
    assert set(shared) == SHARED_DATA_KEYS
    data = get_type_hints(get_task(task).config_class)["data"]
    assert issubclass(data, DataConfig)
    source = ast.parse(textwrap.dedent(inspect.getsource(data)))
    declared = {n.target.id for n in ast.walk(source) if isinstance(n, ast.AnnAssign)}
    assert declared and not declared & set(shared)
    fields, hints, base_hints = {f.name: f for f in dataclasses.fields(data)}, get_type_hints(data), get_type_hints(DataConfig)
    assert list(fields)[: len(shared)] == list(shared)  # written first, in one order
    for name, f in shared.items():
        assert hints[name] == base_hints[name], name
        assert {k: v for k, v in fields[name].metadata.items() if k != "old_name"} == dict(f.metadata), name
        assert fields[name].default == defaults.get(name, f.default), name
    assert {k: getattr(data(), k) for k in defaults} == defaults  # each task keeps its defaults


def test_a_shared_data_key_cannot_be_declared_again():
    from dataclasses import dataclass

    from posbias.config import DataConfig

    with pytest.raises(TypeError, match="'stride' is declared in DataConfig: not again here"):
        @dataclass
        class Again(DataConfig, defaults={"stride": 1}):
            stride: int = 2
    with pytest.raises(TypeError, match="'doc_stride' is not a DataConfig key"):
        class Unknown(DataConfig, old_names={"doc_stride": "stride"}):
            pass


def test_eval_file_takes_a_list_of_shards_in_every_task():
    """The drift resolved: QA's eval_file was `str | None`, tagging's `str | list[str] | None`; both
    take a list now, read as shards of one set as train_file is (QA's reader always took a list)."""
    from posbias.tasks import get_task

    from helpers import tiny_config

    cfg = build_config(tiny_config(data={"eval_file": ["demo:dev", "demo:train"]}))
    sizes = [len(get_task("qa").read(spec, cfg).examples) for spec in cfg.data.eval_file]
    assert len(get_task("qa").read(cfg.data.eval_file, cfg).examples) == sum(sizes)
    tagging = build_config({"task": "tagging", "data": {"eval_file": ["demo:wnut-dev", "demo:wnut-dev"]}})
    assert tagging.data.eval_file == ["demo:wnut-dev", "demo:wnut-dev"]
