"""QA evaluation never decodes NaN or infinite scores: a checkpoint of NaN weights is refused in one
line naming it (evaluate, predict, the CLI with exit 2, nothing written), and no metric outside its
range (a percentage outside 0..100, a value that is not finite) is written."""
import re

import pytest
import torch
from helpers import DEMO_DEV, run_cli, tiny_config

import posbias
from posbias.checkpoint import save_checkpoint
from posbias.config import build_config
from posbias.errors import ConfigError
from posbias.qa.evaluate import check_scores
from posbias.qa.metrics import check_ranges
from posbias.qa.model import build_model
from posbias.tasks import get_task

REFUSED = "the model's start/end scores are NaN or infinite"


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    """A tiny posbias QA checkpoint (SQuAD v1) with every weight NaN."""
    torch.manual_seed(0)
    cfg = build_config(tiny_config())
    tokenizer = get_task("qa").load_tokenizer(cfg)
    model = build_model(cfg.model, tokenizer, null_answer=False)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    out = tmp_path_factory.mktemp("models") / "nan_qa"
    save_checkpoint(model, cfg, tokenizer, out)
    return out


def test_evaluate_refuses_a_model_of_nan_weights_naming_it(tmp_path, nan_checkpoint):
    with pytest.raises(ConfigError, match=f"^{re.escape(str(nan_checkpoint))}: {REFUSED}"):
        posbias.evaluate(nan_checkpoint, DEMO_DEV, tmp_path / "ev", overrides=["data.max_eval_examples=8"],
                         progress=False)
    assert not (tmp_path / "ev").exists()
    with pytest.raises(ConfigError, match=f"^{re.escape(str(nan_checkpoint))}: {REFUSED}"):
        posbias.predict(nan_checkpoint, question="Who ruled?", context="The Normans ruled Normandy.")


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path, nan_checkpoint):
    r = run_cli("-q", "evaluate", "qa", "--model", str(nan_checkpoint), "--data", DEMO_DEV,
                "--output-dir", str(tmp_path / "ev"), "data.max_eval_examples=8")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"posbias: error: {nan_checkpoint}: {REFUSED}"), \
        r.stderr[-2000:]
    assert not (tmp_path / "ev").exists()


def test_scores_may_be_masked_with_minus_inf_but_not_nan_or_plus_inf():
    ok = {"start_logits": torch.tensor([[0.5, float("-inf")]]), "mask": torch.tensor([[True, False]]),
          "forward": {"first": torch.tensor([[torch.finfo(torch.float32).min, 1.0]])}}
    check_scores(ok, "m")  # -inf and the dtype's minimum are how heads mask
    for bad in (float("nan"), float("inf")):
        nested = {**ok, "forward": {"first": torch.tensor([[bad, 1.0]])}}  # MaP: one dict per direction
        with pytest.raises(ConfigError, match=f"^m: {REFUSED}"):
            check_scores(nested, "m")


def test_a_metric_outside_its_range_is_not_written():
    good = {"exact_match": 0.0, "f1": 100.0, "total": 3, "by_answer_length": {"01": {"total": 3, "f1": 50.0}},
            "best_f1_thresh": -3.5}
    check_ranges(good)
    for path, bad in ((("f1",), 170.95), (("by_answer_length", "01", "f1"), -1.0),
                      (("best_f1_thresh",), float("nan")), (("exact_match",), float("inf"))):
        result = {**good, "by_answer_length": {"01": dict(good["by_answer_length"]["01"])}}
        target = result
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = bad
        with pytest.raises(RuntimeError, match=rf"QA metrics: {re.escape('.'.join(path))} = .* outside its range"):
            check_ranges(result)
