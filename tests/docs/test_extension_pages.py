"""The extension examples of docs/contributing.md (a head, a perturbation, a task) run as written:
each python block is executed in a fresh namespace, with only its step count lowered, and what it
registers is then checked by use: built through its registry, trained on a tiny random encoder, its
options checked by name and type. Registrations are undone after each test, so no other test sees
the toy names."""
import json
import re
import warnings
from pathlib import Path

import pytest

from posbias import registry
from posbias.errors import ConfigError
from posbias.registry import HEADS, PERTURBATIONS, TASKS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "contributing.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def _block(name: str) -> str:
    """The one python block that registers `name`."""
    found = [b for b in BLOCKS if f'register("{name}"' in b]
    assert len(found) == 1, f"docs/contributing.md: {len(found)} python blocks register {name!r}"
    return found[0]


@pytest.fixture
def page_run(tmp_path, monkeypatch):
    """Run a block of the page in tmp_path, as a user's script would, with the registries restored
    afterwards; returns the block's namespace."""
    for reg in (TASKS, HEADS, PERTURBATIONS):  # the built-in names first: the tasks register the rest
        reg.names()
    for reg in (TASKS, HEADS, PERTURBATIONS):
        for table in ("_table", "_traits", "_builtin"):
            monkeypatch.setattr(reg, table, dict(getattr(reg, table)))
    monkeypatch.setitem(registry._plugins, "loaded", True)  # no entry points: the page's own code only
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def run(name: str) -> dict:
        code = _block(name).replace("train.max_steps=20", "train.max_steps=2")
        namespace = {"__name__": f"contributing_{name}"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(code, f"docs/contributing.md ({name})", "exec"), namespace)
        return namespace

    return run


def test_the_page_has_one_example_per_extension_point():
    assert len(BLOCKS) == 3
    for name in ("mlp", "mask_tokens", "lowercase_tagging"):
        _block(name)


def _run_info(run_dir) -> dict:
    return json.loads((Path(run_dir) / "run_info.json").read_text(encoding="utf-8"))


def test_the_head_example_registers_a_head_that_trains(page_run, tmp_path):
    ns = page_run("mlp")
    assert "mlp" in HEADS.names() and HEADS.traits("mlp") == {"debias": True}
    meta = json.loads((tmp_path / "runs/mlp_head/best/posbias_model.json").read_text(encoding="utf-8"))
    assert meta["head"] == "mlp"
    assert ns["summary"]["steps"] == 2 and "f1" in json.dumps(ns["summary"]["eval"])
    head = HEADS.get("mlp")(hidden_size=8, null_answer=True, width=4)
    from posbias.qa.heads import SpanHead

    assert isinstance(head, SpanHead) and head.mlp[0].out_features == 4
    import posbias

    with pytest.raises(ConfigError, match=r"model\.head_options\.width must be >= 1"):
        posbias.load_config("tiny", ["model.head=mlp", "model.head_options.width=0"])


def test_the_perturbation_example_registers_a_perturbation_that_masks_tokens(page_run, tmp_path):
    import torch

    from posbias.config import RESOURCES
    from transformers import AutoTokenizer

    page_run("mask_tokens")
    info = _run_info(tmp_path / "runs/mask_tokens")
    assert info["status"] == "finished"
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    p = PERTURBATIONS.get("mask_tokens")(p=1.0)
    p.bind(None, tok)
    enc = tok(["ana went to oslo", "bo"], padding=True, return_tensors="pt")
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    before = batch["input_ids"].clone()
    out = p(batch, torch.Generator().manual_seed(0))
    assert torch.equal(batch["input_ids"], before)  # a new batch: the input is untouched
    special = torch.isin(before, torch.tensor(tok.all_special_ids))
    words = batch["attention_mask"].bool() & ~special
    assert (out["input_ids"][words] == tok.mask_token_id).all()
    assert torch.equal(out["input_ids"][~words], before[~words])  # specials and padding kept
    import posbias

    with pytest.raises(ConfigError, match=r"perturb\[0\]\.p must be in \[0, 1\]"):
        posbias.load_config("tiny_tagging", ["perturb=[{name: mask_tokens, p: 2}]"])


def test_the_task_example_registers_a_task_that_trains_on_lowercased_words(page_run, tmp_path):
    from posbias.tasks import get_task, missing_members

    page_run("lowercase_tagging")
    task = get_task("lowercase_tagging")
    assert missing_members(task) == []
    assert _run_info(tmp_path / "runs/lowercase")["status"] == "finished"
    cfg = task.config_class  # tagging's config class, selected by the config's task
    import posbias

    c = posbias.load_config("tiny_tagging", ["task=lowercase_tagging"])
    assert isinstance(c, cfg) and c.task == "lowercase_tagging"
    words = [w for e in task.read("demo:wnut-dev", c).examples for w in e.words]
    assert words and all(w == w.lower() for w in words)
    assert any(w != w.lower() for e in get_task("tagging").read("demo:wnut-dev", c).examples for w in e.words)


def test_the_task_table_names_every_member_of_the_protocol():
    from posbias.tasks import Task

    members = set(Task.__annotations__) | {n for n, v in vars(Task).items() if callable(v) and not n.startswith("_")}
    text = PAGE.read_text(encoding="utf-8")
    missing = sorted(m for m in members if f"`{m}`" not in text)
    assert not missing, f"docs/contributing.md's table of Task members lacks {missing}"


def test_the_task_example_trains_from_the_cli_through_an_entry_point(tmp_path):
    """The page's task module, installed as a package declaring a `posbias.plugins` entry point,
    is a command of `posbias train`."""
    import os

    from helpers import run_cli

    plugin = tmp_path / "plugin"
    info = plugin / "lowercase_tagging_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (plugin / "lowercase_tagging_plugin.py").write_text(_block("lowercase_tagging").split("import posbias\n")[0],
                                                        encoding="utf-8")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lowercase-tagging-plugin\nVersion: 0.1\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text("[posbias.plugins]\nlowercase = lowercase_tagging_plugin\n",
                                           encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "run"
    r = run_cli("train", "lowercase_tagging", "-c", "tiny_tagging", "task=lowercase_tagging",
                f"train.output_dir={out}", "train.max_steps=2", "train.device=cpu", env=env)
    assert r.returncode == 0, r.stderr
    assert _run_info(out)["status"] == "finished"
    assert "lowercase_tagging" in run_cli("train", "--help", env=env).stdout
