"""Tagging evaluation never decodes NaN or infinite logits: argmax would still pick a tag for every
word, so a checkpoint of NaN weights is refused in one line naming it (evaluate, predict, the CLI with
exit 2, nothing written); and no metric outside 0..100 is written."""
import re

import pytest
import torch
from helpers import run_cli

import posbias
from posbias.checkpoint import save_checkpoint
from posbias.config import config_from
from posbias.errors import ConfigError
from posbias.tagging.metrics import check_ranges
from posbias.tagging.model import build_model
from posbias.tasks import get_task

REFUSED = "the model's logits are NaN or infinite"
DATA = "demo:wnut-dev"
TYPES = ("person", "location", "corporation", "product", "creative-work", "group")  # WNUT-17's


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    """A tiny posbias tagging checkpoint (WNUT-17's tags, IOB2) with every weight NaN."""
    torch.manual_seed(0)
    cfg = config_from("tiny_tagging")
    tokenizer = get_task("tagging").load_tokenizer(cfg)
    labels = ["O"] + [f"{p}-{t}" for t in TYPES for p in "BI"]
    model = build_model(cfg.model, tokenizer, labels, "iob2")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    out = tmp_path_factory.mktemp("models") / "nan_tagger"
    save_checkpoint(model, cfg, tokenizer, out)
    return out


def test_evaluate_and_predict_refuse_a_model_of_nan_weights_naming_it(tmp_path, nan_checkpoint):
    with pytest.raises(ConfigError, match=f"^{re.escape(str(nan_checkpoint))}: {REFUSED}"):
        posbias.evaluate(nan_checkpoint, DATA, tmp_path / "ev", overrides=["data.max_eval_examples=5"],
                         progress=False)
    assert not (tmp_path / "ev").exists()
    with pytest.raises(ConfigError, match=f"^{re.escape(str(nan_checkpoint))}: {REFUSED}"):
        posbias.predict(nan_checkpoint, text="Ada Lovelace wrote it.")


def test_the_position_diagnosis_refuses_it_too(tmp_path, nan_checkpoint):
    """`diagnose tagging` runs its own batches of duplicated sentences (F1(alpha)): the same check."""
    with pytest.raises(ConfigError, match=f"^{re.escape(str(nan_checkpoint))}: {REFUSED}"):
        posbias.diagnose(nan_checkpoint, DATA, tmp_path / "d", k_max=2, quantiles=None, progress=False,
                         overrides=["data.max_eval_examples=5"])
    assert not (tmp_path / "d").exists()


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path, nan_checkpoint):
    r = run_cli("-q", "evaluate", "tagging", "--model", str(nan_checkpoint), "--data", DATA,
                "--output-dir", str(tmp_path / "ev"), "data.max_eval_examples=5")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"posbias: error: {nan_checkpoint}: {REFUSED}"), \
        r.stderr[-2000:]
    assert not (tmp_path / "ev").exists()


def test_a_metric_outside_its_range_is_not_written():
    good = {"precision": 0.0, "recall": 100.0, "f1": 0.0, "f1_seqeval_subtoken": 12.5, "entities": 3,
            "per_class": {"person": {"precision": 50.0, "recall": 50.0, "f1": 50.0, "support": 2}}}
    check_ranges(good)
    for key, bad in (("f1", 101.0), ("f1_seqeval_subtoken", float("nan")), ("recall", -0.5)):
        with pytest.raises(RuntimeError, match=rf"tagging metrics: {key} = .* outside its range"):
            check_ranges({**good, key: bad})
    nested = {**good, "per_class": {"person": {**good["per_class"]["person"], "f1": float("inf")}}}
    with pytest.raises(RuntimeError, match=r"tagging metrics: per_class\.person\.f1 = inf"):
        check_ranges(nested)
