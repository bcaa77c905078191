"""Extension points of one shape: a head and a perturbation from outside the package, each one file
and one registration line, found through the `posbias.plugins` entry points, trained through the
CLI and through the generic Hugging Face collator; the generic collator equals the named ones."""
import json
import os
import warnings

import pytest
import torch
from transformers import AutoTokenizer, DataCollatorForTokenClassification

from helpers import cli_here, run_cli, tiny_config
from posbias import registry
from posbias.config import RESOURCES
from posbias.errors import ConfigError
from posbias.hf import VIEW, ContextPerturbationCollator, PerturbationCollator, PositionShiftCollator

PLUGIN = '''"""A posbias plug-in: one head and one perturbation."""
from typing import Annotated

from torch import nn

from posbias.qa.heads.pointer import cross_entropy
from posbias.qa.heads.span_scores import AdditiveSpans, masked_logits, softmax_mask
from posbias.registry import HEADS, PERTURBATIONS
from posbias.typed import Bound


class ScaledHead(AdditiveSpans, nn.Module):
    """Start and end scores of one Linear(d, 2), times `scale`."""

    def __init__(self, hidden_size, null_answer=False, scale=1.0):
        super().__init__()
        self.null_answer, self.scale = null_answer, scale
        self.qa_outputs = nn.Linear(hidden_size, 2)

    def forward(self, hidden, batch, targets=None):
        start, end = (self.qa_outputs(hidden) * self.scale).unbind(-1)
        mask = softmax_mask(batch, "context", self.null_answer)
        out = {"start_logits": masked_logits(start, mask), "end_logits": masked_logits(end, mask)}
        if targets is not None:
            out["loss"] = (cross_entropy(out["start_logits"], targets["start_positions"])
                           + cross_entropy(out["end_logits"], targets["end_positions"])) / 2
        return out


@HEADS.register("toy_scaled")
def toy_scaled(hidden_size: int, null_answer: bool = False, scale: Annotated[float, Bound(0, lo_open=True)] = 1.0):
    return ScaledHead(hidden_size, null_answer, scale)


class ConstantShift:
    """Every row's position ids moved up by `offset`, [CLS] included."""

    sets_positions = True

    def __init__(self, offset):
        self.offset, self.base, self.pad = offset, 0, 0

    def bind(self, model, tokenizer=None):
        self.base, self.pad = model.position_base, model.position_pad

    def __call__(self, batch, generator):
        mask = batch["attention_mask"]
        pos = (mask.cumsum(-1) - 1 + self.base + self.offset).masked_fill(mask == 0, self.pad)
        return {**batch, "position_ids": pos}


@PERTURBATIONS.register("toy_constant_shift")
def toy_constant_shift(*, offset: Annotated[int, Bound(0)] = 3):
    return ConstantShift(offset)
'''


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """A folder that, on the Python path, is an installed package declaring a `posbias.plugins`
    entry point (what `pip install` of a package with that entry point leaves)."""
    d = tmp_path_factory.mktemp("plugin")
    (d / "posbias_toy_plugin.py").write_text(PLUGIN, encoding="utf-8")
    info = d / "posbias_toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: posbias-toy-plugin\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[posbias.plugins]\ntoy = posbias_toy_plugin\n", encoding="utf-8")
    return d


@pytest.fixture
def plugin_loaded(plugin_dir, monkeypatch):
    """The plug-in loaded in this process through its entry point (its names stay registered: the
    head and the perturbation are complete, so later tests that walk the registries can build them)."""
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setitem(registry._plugins, "loaded", False)  # look for entry points again in this process
    registry.load_plugins()


def _cli_env(plugin_dir):
    return {"PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}


def test_a_plugin_head_and_perturbation_train_and_evaluate_through_the_cli(plugin_dir, tmp_path, request):
    import yaml

    cfg = tiny_config(tmp_path, model={"head": "toy_scaled", "head_options": {"scale": 2.0}},
                      train={"max_steps": 2})
    cfg["perturb"] = [{"name": "toy_constant_shift", "offset": 5}]
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    without = run_cli("train", "qa", "-c", str(path))
    assert without.returncode == 2 and "unknown head 'toy_scaled'" in without.stderr
    r = run_cli("train", "qa", "-c", str(path), env=_cli_env(plugin_dir))
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    meta = json.loads((run / "best" / "posbias_model.json").read_text(encoding="utf-8"))
    assert meta["head"] == "toy_scaled"
    counts = json.loads((run / "position_updates.json").read_text(encoding="utf-8"))["counts"]
    assert counts[:5] == [0] * 5 and counts[5] == 2  # every token moved up by 5, [CLS] included, both steps
    ev = run_cli("evaluate", "qa", "--model", str(run / "best"), "--data", "demo:dev", "data.max_eval_examples=8",
                 "--json", env=_cli_env(plugin_dir))
    assert ev.returncode == 0, ev.stderr
    assert "f1" in json.loads(ev.stdout)
    # The plug-in's options checked by name and bound: refusals, here with the plug-in loaded in this process.
    request.getfixturevalue("plugin_loaded")
    bad = cli_here("train", "qa", "-c", path, "perturb=[{name: toy_constant_shift, ofset: 5}]")
    assert bad.returncode == 2 and "perturb[0]: unknown option 'ofset' for toy_constant_shift; did you mean " \
                                   "perturb[0].offset?" in bad.stderr
    bad = cli_here("train", "qa", "-c", path, "model.head_options.scale=-1")
    assert bad.returncode == 2 and "model.head_options.scale must be > 0, got -1" in bad.stderr


@pytest.fixture(scope="module")
def bert_tok():
    return AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))


def _tagger(tok):
    from helpers.hf import bert

    return bert(tok).train()


def _features(tok):
    from helpers.hf import features

    return features(tok)


def test_a_plugin_perturbation_trains_through_the_generic_hf_collator(plugin_loaded, bert_tok, tmp_path):
    from helpers.hf import tiny_trainer

    model = _tagger(bert_tok)
    coll = PerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, "toy_constant_shift",
                                offset=7)
    assert coll.mode == "replace"  # no paper mode declared: the perturbed batch only
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append((m.training, kw.get("position_ids"))),
                                    with_kwargs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_trainer(tmp_path, model, bert_tok, coll).train()
    train_pos = [pos for training, pos in seen if training]
    assert len(train_pos) == 3 and all((pos[:, 0] == 7).all() for pos in train_pos)
    with pytest.raises(ConfigError, match=r"toy_constant_shift.offset must be >= 0, got -1"):
        PerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, "toy_constant_shift",
                             offset=-1)


@pytest.mark.parametrize("name, named", [
    ("rpp", dict(method="rpp")),
    ("randomized_positions", dict(method="randomized_positions")),
    ("random_padding", dict(method="random_padding", max_len=40)),
])
@pytest.mark.parametrize("mode", ["replace", "augment"])
def test_the_generic_collator_equals_the_position_shift_collator(bert_tok, name, named, mode):
    options = {"max_len": named["max_len"]} if "max_len" in named else {}
    out = {}
    for make in (lambda m: PositionShiftCollator(DataCollatorForTokenClassification(bert_tok), m, bert_tok, seed=4,
                                                 mode=mode, **named),
                 lambda m: PerturbationCollator(DataCollatorForTokenClassification(bert_tok), m, bert_tok, name,
                                                seed=4, mode=mode, **options)):
        coll = make(_tagger(bert_tok))
        out[type(coll).__name__] = [coll(_features(bert_tok))[VIEW] for _ in range(3)]
    a, b = out["PositionShiftCollator"], out["PerturbationCollator"]
    for x, y in zip(a, b):
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("mode", ["replace", "augment"])
def test_the_generic_collator_equals_the_context_perturbation_collator(bert_tok, mode):
    model = _tagger(bert_tok)
    a = ContextPerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, max_len=40, seed=2,
                                    mode=mode)
    b = PerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, "context_perturbation",
                             max_len=40, seed=2, mode=mode)
    for _ in range(3):
        x, y = a(_features(bert_tok))[VIEW], b(_features(bert_tok))[VIEW]
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)


def test_the_generic_collator_checks_options_by_name(bert_tok):
    model = _tagger(bert_tok)
    with pytest.raises(ConfigError, match=r"^rpp: unknown option 'cap' for rpp"):
        PerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, "rpp", cap=3)
    with pytest.raises(ConfigError, match=r"unknown perturbation 'rp'; did you mean 'rpp'\?"):
        PerturbationCollator(DataCollatorForTokenClassification(bert_tok), model, bert_tok, "rp")


TASK_PLUGIN = '''"""A posbias plug-in task: extractive QA under its own name, with a diagnosis of its own."""
import sys
from dataclasses import dataclass

from posbias.arguments import task_options
from posbias.qa.config import QAConfig
from posbias.registry import TASKS


@dataclass
class ToyConfig(QAConfig):
    task: str = "toy"


class ToyTask:
    """QA's members under another name; `read` and `diagnose` are its own."""

    name = "toy"
    config_class = ToyConfig
    cli_help = "a toy task from a plug-in"
    cli_commands = ("train", "diagnose")

    def add_cli_arguments(self, command, parser):
        if command == "diagnose":
            parser.add_argument("--data", required=True, help="SQuAD JSON")
            parser.add_argument("--output-dir", required=True, help="where the diagnosis goes")
            parser.add_argument("--note", default="none", help="what the toy diagnosis says")
            task_options(parser, "note")  # passed to its `diagnose` as a keyword

    def read(self, spec, cfg):
        print(f"toy task reads {spec}", file=sys.stderr)
        return TASKS.get("qa").read(spec, cfg)

    def diagnose(self, model, data, output_dir, *, overrides=None, progress=True, note="none", **common):
        return {"verdict_lines": [f"toy diagnosis of {data}: {note}"]}

    def __getattr__(self, member):  # every other member: QA's
        if member.startswith("__"):
            raise AttributeError(member)
        return getattr(TASKS.get("qa"), member)


TASKS.register("toy")(ToyTask())
'''


@pytest.fixture(scope="module")
def task_plugin_dir(tmp_path_factory):
    """An installed package declaring a task through the `posbias.plugins` entry point."""
    d = tmp_path_factory.mktemp("task_plugin")
    (d / "posbias_toy_task.py").write_text(TASK_PLUGIN, encoding="utf-8")
    info = d / "posbias_toy_task-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: posbias-toy-task\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[posbias.plugins]\ntoy_task = posbias_toy_task\n", encoding="utf-8")
    return d


def test_a_plugin_task_runs_from_the_cli(task_plugin_dir, tmp_path):
    import yaml

    env = _cli_env(task_plugin_dir)
    listed = run_cli("train", "--help", env=env)
    assert listed.returncode == 0 and "toy" in listed.stdout and "a toy task from a plug-in" in listed.stdout
    assert "toy" not in run_cli("train", "--help").stdout  # without the plug-in installed
    options = run_cli("diagnose", "toy", "--help", env=env)
    assert "--note NOTE" in options.stdout and "--model MODEL" in options.stdout  # the task's and the CLI's
    assert "fewest questions a position bucket needs" in options.stdout  # the verdict's, in the task's unit

    cfg = {**tiny_config(tmp_path, train={"max_steps": 2}), "task": "toy"}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    r = run_cli("train", "toy", "-c", str(path), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "toy task reads" in r.stderr  # the plug-in's own code read the data
    run = tmp_path / "run"
    assert f"next: posbias diagnose toy --model {run / 'best'}" in r.stdout
    d = run_cli("diagnose", "toy", "--model", str(run / "best"), "--data", "demo:dev", "--output-dir",
                str(tmp_path / "d"), "--note", "hello", env=env)
    assert d.returncode == 0, d.stderr[-3000:]
    assert d.stdout.strip() == "toy diagnosis of demo:dev: hello"
    wrong = run_cli("train", "qa", "-c", str(path), env=env)
    assert wrong.returncode == 2 and "`train qa` got a config for task 'toy'" in wrong.stderr
