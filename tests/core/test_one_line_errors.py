"""Mistakes a user can make that once ended in a traceback, a usage block or a failure minutes later:
each is now one `posbias: error:` line naming what to fix, exit 2, before anything is written.

No-answer probabilities for a v1 file (`score qa --na-probs`); a spec placeholder that is not one of
the documented plain names; a sentence-transformers `modules.json` naming a path outside its folder or
a module type that is not sentence-transformers' own; `--cache-dir` naming a file; `--gpus` without
GPUs; a store whose `metrics_json` is not JSON; and every bad option value argparse refuses."""
from __future__ import annotations

import json
import sqlite3

import pytest
import yaml
from helpers import DEMO_DEV, cli_here, run_cli
from transformers import BertConfig

from posbias.config import RESOURCES
from posbias.errors import ConfigError
from posbias.experiment import SCHEMA, load_experiment
from posbias.qa.readers import read_qa
from posbias.retrieval.embed import check_cache_dir, check_st_modules, load_embedder, module_path, st_module


def one_line(r, *names: str) -> str:
    """The run `r` failed with exit 2 and one stderr line, `posbias: error: ...`, naming each of `names`."""
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    line = lines[0]
    assert line.startswith("posbias: error: ") and "Traceback" not in line and "usage:" not in r.stderr, line
    for name in names:
        assert name in line, (name, line)
    return line


# ------------------------------------------------------------------------------------------- score qa
def test_no_answer_probabilities_for_a_v1_file(tmp_path):
    preds, probs = tmp_path / "pred.json", tmp_path / "na.json"
    gold = read_qa(DEMO_DEV).gold()  # SQuAD v1.1: every question answerable
    preds.write_text(json.dumps({q: "" for q in gold}), encoding="utf-8")
    probs.write_text(json.dumps({q: 0.5 for q in gold}), encoding="utf-8")
    line = one_line(cli_here("score", "qa", "--data", DEMO_DEV, "--predictions", str(preds), "--na-probs", str(probs)),
                    str(probs), DEMO_DEV, "v2.0")
    assert "no unanswerable question" in line
    one_line(cli_here("score", "qa", "--data", DEMO_DEV, "--predictions", str(preds), "--na-probs", str(probs),
                      "--version", "1.1"), "--version 1.1")


# ---------------------------------------------------------------------------------- spec placeholders
@pytest.mark.parametrize("placeholder", ["{output_dir.nosuch}", "{seed.__class__}", "{seed[0]}", "{seed!r}",
                                         "{seed:03d}", "{}", "{sed}"])
def test_a_checkpoint_placeholder_is_one_of_the_documented_plain_names(tmp_path, placeholder):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "base": "tiny", "seeds": [1], "output_dir": str(tmp_path / "exp"),
                                    "methods": {"hf": {"checkpoint": f"models/{placeholder}/best"}}}), encoding="utf-8")
    if placeholder == "{output_dir.nosuch}":  # the reported case, end to end
        line = one_line(run_cli("experiment", "run", str(spec)), str(spec), "methods.hf.checkpoint", placeholder)
        assert "{seed}, {dataset}, {output_dir}" in line
        assert not (tmp_path / "exp").exists()
    with pytest.raises(ConfigError, match=r"spec.yaml: methods.hf.checkpoint '.*': (.*) is not one of") as e:
        load_experiment(spec)
    assert f" {placeholder} is not one of" in str(e.value)
    assert not (tmp_path / "exp").exists()


def test_plain_placeholders_and_doubled_braces_are_filled():
    from posbias.experiment.spec import fill_placeholders

    fields = {"seed": 3, "dataset": "squad", "output_dir": "/runs/x"}
    assert fill_placeholders("{output_dir}/{dataset}/seed{seed}{{a}}", fields, "k") == "/runs/x/squad/seed3{a}"
    with pytest.raises(ConfigError, match=r"k 'a\{b': .*\(placeholders: \{seed\}"):
        fill_placeholders("a{b", fields, "k")


# ------------------------------------------------------------------------- sentence-transformers folders
GOOD_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def st_folder(root, modules) -> str:
    """A sentence-transformers folder as far as posbias reads it before loading: a tiny BERT config,
    the tiny tokenizer, `modules` as its modules.json (no weights: nothing gets that far)."""
    folder = root / "st"
    folder.mkdir()
    BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64).save_pretrained(folder)
    for f in (RESOURCES / "tiny_tokenizer").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "1_Pooling").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize("field, value", [("path", "../evil"), ("type", "sentence_transformers.models..evil.X")])
def test_a_modules_json_entry_outside_sentence_transformers_is_refused_before_loading(tmp_path, field, value):
    modules = json.loads(json.dumps(GOOD_MODULES))
    modules[1][field] = value
    folder = st_folder(tmp_path, modules)
    r = cli_here("diagnose", "retrieval", "--model", folder, "--data", "demo:dev", "--output-dir", str(tmp_path / "o"),
                 "--no-bm25", "--device", "cpu")
    one_line(r, f"{folder}/modules.json", "module '1'", repr(value))
    assert not (tmp_path / "o").exists()


def test_a_module_this_sentence_transformers_lacks_is_one_line(tmp_path):
    """A type of the right shape that this version does not have: its ImportError, named."""
    pytest.importorskip("sentence_transformers")
    modules = json.loads(json.dumps(GOOD_MODULES))
    modules[0]["type"] = "sentence_transformers.models.nosuch.Transformer"
    folder = st_folder(tmp_path, modules)
    with pytest.raises(ConfigError, match=r"st: sentence-transformers cannot import a module its modules.json names"):
        load_embedder(folder, device="cpu", precision="fp32")


def test_modules_json_paths_and_types(tmp_path):
    folder = st_folder(tmp_path, GOOD_MODULES)
    assert check_st_modules(folder) == GOOD_MODULES
    (tmp_path / "outside").mkdir()
    (tmp_path / "st" / "link").symlink_to(tmp_path / "outside")
    for path, inside in [("", True), ("1_Pooling", True), ("2_Normalize", True), ("a/../1_Pooling", False),
                         ("..", False), ("/etc", False), ("C:\\x", False), ("a\\..\\..\\x", False), ("link", False),
                         ("x\0y", False), (None, False), (3, False)]:
        assert module_path(folder, path) is inside, path
    for kind, ours in [("sentence_transformers.models.Normalize", True),
                       ("sentence_transformers.base.modules.transformer.Transformer", True),  # as 6.x writes it
                       ("sentence_transformers.sentence_transformer.modules.pooling.Pooling", True),
                       ("sentence_transformers.models..evil.X", False), ("sentence_transformers.models.Module", False),
                       ("sentence_transformers.models.evil", False), ("evil.Pooling", False),
                       ("sentence_transformers.util.Pooling", False), ("sentence_transformers.models.a.b.Pooling", False),
                       ("sentence_transformers.models.Pooling ", False), (None, False)]:
        assert st_module(kind) is ours, kind


# ---------------------------------------------------------------------------- options checked up front
def test_a_cache_dir_that_is_a_file_is_refused_before_any_embedding(tmp_path):
    (tmp_path / "small.json").write_text("{}", encoding="utf-8")
    for cache in (tmp_path / "small.json", tmp_path / "small.json" / "sub"):
        r = run_cli("diagnose", "retrieval", "--model", "no-such-model", "--data", "demo:dev", "--output-dir",
                    str(tmp_path / "o"), "--cache-dir", str(cache))
        one_line(r, "--cache-dir", str(tmp_path / "small.json"), "existing file")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="small.json is an existing file, not a folder"):  # the API's cache_dir
        check_cache_dir(tmp_path / "small.json")
    check_cache_dir(tmp_path / "new" / "cache")  # to be made: fine


def test_gpus_the_machine_does_not_have_are_refused_before_any_lane_starts(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "base": "tiny", "seeds": [1], "methods": {"baseline": {}},
                                    "output_dir": str(tmp_path / "exp")}), encoding="utf-8")
    r = run_cli("experiment", "run", str(spec), "--gpus", "0,1")  # run_cli hides the GPUs
    one_line(r, "--gpus 0,1", "no CUDA device", "--device cpu")
    assert not (tmp_path / "exp").exists()


# ---------------------------------------------------------------------------------------------- store
def test_a_store_row_that_is_not_json_names_the_store_and_the_run(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    db = exp / "experiment.sqlite"
    with sqlite3.connect(db) as conn:
        conn.executescript(SCHEMA)
        for name, metrics in (("base/seed1", json.dumps({"val": {"f1": 50.0}})), ("base/seed2", "{not json")):
            conn.execute("INSERT INTO runs (name, method, seed, config_json, status, metrics_json) VALUES "
                         "(?, ?, ?, ?, ?, ?)", (name, "base", int(name[-1]), json.dumps({"task": "qa"}), "finished",
                                                metrics))
    conn.close()
    one_line(cli_here("experiment", "report", str(exp), "--bootstrap-samples", "0"), str(db), "'base/seed2'",
             "metrics_json is not valid JSON")
    assert not (exp / "report.md").exists() and not (exp / "plots").exists()


# ---------------------------------------------------------------------------------------- option values
@pytest.mark.parametrize("argv, option", [
    (["diagnose", "qa", "--model", "m", "--data", "d", "--output-dir", "OUT", "--min-bucket", "0"], "--min-bucket"),
    (["diagnose", "qa", "--model", "m", "--data", "d", "--output-dir", "OUT", "--bootstrap-samples", "-1"],
     "--bootstrap-samples"),
    (["diagnose", "qa", "--model", "m", "--data", "d", "--output-dir", "OUT", "--quality-floor", "nan"],
     "--quality-floor"),
    (["diagnose", "tagging", "--model", "m", "--data", "d", "--output-dir", "OUT", "--quantiles", "0.8", "0.2"],
     "--quantiles"),
    (["diagnose", "retrieval", "--model", "m", "--data", "d", "--output-dir", "OUT", "--chunk-tokens", "x"],
     "--chunk-tokens"),
    (["diagnose", "generation", "--model", "m", "--data", "d", "--output-dir", "OUT", "--mspoe-ratios", "0.5", "2"],
     "--mspoe-ratios"),
    (["diagnose", "generation", "--model", "m", "--data", "d", "--output-dir", "OUT", "--mspoe-ratios", "1.8", "1.2"],
     "--mspoe-ratios"),
    (["evaluate", "qa", "--model", "m", "--data", "d", "--output-dir", "OUT", "--precision", "fp64"], "--precision"),
    (["data", "build", "--input", "i", "--out", "OUT", "--seed", "-1"], "--seed"),
    (["experiment", "run", "spec.yaml", "--output-dir", "OUT", "--gpus", "0,0"], "--gpus"),
    (["train", "qa", "train.output_dir=OUT"], "-c/--config"),  # a required option missing
    (["nosuch"], "COMMAND"),
])
def test_a_bad_option_value_is_one_line_without_the_usage_block(tmp_path, argv, option):
    out = str(tmp_path / "out")
    line = one_line(run_cli(*[a.replace("OUT", out) for a in argv]), option)
    assert line.endswith("--help)")  # where to read the command's options
    assert not (tmp_path / "out").exists()


def test_help_is_still_argparse_s_own():
    r = run_cli("diagnose", "qa", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: posbias diagnose qa") and "--min-bucket" in r.stdout
