"""--precision / train.mixed_precision / train.eval_precision end to end: the option reaches training
and every command that runs a model, the resolved choice and reason are recorded, and a bf16
evaluation of a trained tiny model scores as the fp32 one does."""
import json

import pytest
import torch

import posbias
import posbias.precision
from posbias.cli import main
from posbias.config import build_config

from helpers import DEMO_DEV, tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("prec")
    posbias.train(build_config(tiny_config(out, train={"max_steps": 4})), progress=False)
    return out / "run" / "best"


def _info(folder):
    return json.loads((folder / "run_info.json").read_text(encoding="utf-8"))


def test_training_records_the_resolved_precision(tmp_path, monkeypatch):
    """`auto` becomes bf16 on hardware with native bf16 and fp32 elsewhere; run_info.json says which
    and why, and accelerate is given the resolved value."""
    for native, expect in [(True, "bf16"), (False, "fp32")]:
        monkeypatch.setattr(posbias.precision, "native_bf16", lambda device, n=native: (n, f"native={n}"))
        out = tmp_path / expect
        cfg = tiny_config(out, train={"max_steps": 1, "mixed_precision": "auto"}, data={"eval_file": None})
        posbias.train(build_config(cfg), progress=False)
        info = _info(out / "run")
        assert info["precision"] == {"precision": expect, "requested": "auto", "reason": f"auto: native={native}",
                                     "source": "train.mixed_precision"}
        assert info["mixed_precision"] == "auto"


def test_bf16_training_is_finite_and_learns(tmp_path, monkeypatch):
    """A bf16 run's encoder runs under bf16 autocast (accelerate's), and its losses are finite and
    fall over a few steps on the tiny model."""
    import posbias.encoders

    autocast_on, real = [], posbias.encoders.EncoderInputs.__call__

    def recording(self, encoder, batch):
        autocast_on.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(self, encoder, batch)

    monkeypatch.setattr(posbias.encoders.EncoderInputs, "__call__", recording)
    cfg = tiny_config(tmp_path, train={"max_steps": 12, "mixed_precision": "bf16", "log_every": 1},
                      data={"eval_file": None})
    posbias.train(build_config(cfg), progress=False)
    assert autocast_on and set(autocast_on) == {(True, torch.bfloat16)}
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses


def test_precision_flag_reaches_every_command(trained, tmp_path, capsys):
    """--precision bf16 on evaluate/predict/diagnose sets train.eval_precision (recorded with the
    outputs, announced once on stderr); --precision fp32 on train sets train.mixed_precision=fp32 (an
    explicit fp32, over accelerate's launch flag or config)."""
    common = ["--model", str(trained), "--data", DEMO_DEV, "data.max_eval_examples=6", "--precision", "bf16"]
    for cmd in ("evaluate", "predict", "diagnose"):
        assert main([cmd, "qa", *common, "--output-dir", str(tmp_path / cmd)]) == 0
        folder = tmp_path / cmd
        assert _info(folder)["precision"]["precision"] == "bf16", cmd
        assert "eval_precision: bf16" in (folder / "config.yaml").read_text(encoding="utf-8")
    assert capsys.readouterr().err.count("posbias: evaluating in bf16") <= 1
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "t", train={"max_steps": 1})), encoding="utf-8")
    assert main(["train", "qa", "-c", str(cfg), "--precision", "fp32"]) == 0
    info = _info(tmp_path / "t" / "run")
    assert info["mixed_precision"] == "fp32" and info["precision"]["precision"] == "fp32"


def test_bad_precision_is_a_one_line_error(trained, capsys):
    assert main(["evaluate", "qa", "--model", str(trained), "--data", DEMO_DEV, "train.eval_precision=half"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.eval_precision" in err


def test_bf16_evaluation_scores_as_fp32(trained, tmp_path, monkeypatch):
    """The same checkpoint evaluated in fp32 and bf16: the forward really ran in bf16 (the output
    dtype of the encoder's first linear layer, seen by a hook), and EM/F1 stay within a few questions of fp32 (a random tiny model
    has near-tied spans, so a handful of answers may flip)."""
    import posbias.evaluation as ev  # where evaluation looks load_checkpoint up

    seen, real = [], ev.load_checkpoint

    def hooked(*a, **k):
        net, tok, cfg = real(*a, **k)
        linear = next(m for m in net.encoder.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        return net, tok, cfg

    monkeypatch.setattr(ev, "load_checkpoint", hooked)
    res = {}
    for precision in ("fp32", "bf16"):
        seen.clear()
        res[precision] = posbias.evaluate(trained, DEMO_DEV, tmp_path / precision, progress=False,
                                          overrides=["data.max_eval_examples=40", f"train.eval_precision={precision}"])
        assert seen and set(seen) == {torch.float32 if precision == "fp32" else torch.bfloat16}, precision
    assert abs(res["fp32"]["f1"] - res["bf16"]["f1"]) <= 100 * 4 / 40, res
    p32 = json.loads((tmp_path / "fp32" / "predictions.json").read_text())
    p16 = json.loads((tmp_path / "bf16" / "predictions.json").read_text())
    assert p32.keys() == p16.keys() and sum(p32[q] != p16[q] for q in p32) <= 4


def _encoder_autocast(monkeypatch) -> list:
    """(autocast on, its dtype) on the CPU at each encoder call of the runs that follow."""
    import posbias.encoders

    seen, real = [], posbias.encoders.EncoderInputs.__call__

    def recording(self, encoder, batch):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(self, encoder, batch)

    monkeypatch.setattr(posbias.encoders.EncoderInputs, "__call__", recording)
    return seen


def test_accelerate_launch_precision_wins_over_the_default(tmp_path, monkeypatch):
    """`accelerate launch --mixed_precision bf16` (or the accelerate config) sets
    ACCELERATE_MIXED_PRECISION: a run that leaves train.mixed_precision at its default trains in bf16,
    and run_info.json says accelerate chose it. Before, posbias's default fp32 was passed to
    accelerate and silently overrode the user's choice."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    seen = _encoder_autocast(monkeypatch)
    posbias.train(build_config(tiny_config(tmp_path, train={"max_steps": 1}, data={"eval_file": None})),
                  progress=False)
    assert seen and set(seen) == {(True, torch.bfloat16)}
    info = _info(tmp_path / "run")
    assert info["precision"]["precision"] == "bf16" and info["precision"]["source"] == "accelerate", info["precision"]
    assert "ACCELERATE_MIXED_PRECISION=bf16" in info["precision"]["reason"]


@pytest.mark.parametrize("option", ["train.mixed_precision=fp32", "--precision fp32", "--precision auto"])
def test_an_explicit_precision_wins_over_accelerates(option, tmp_path, monkeypatch):
    """train.mixed_precision / --precision set: posbias's option wins over ACCELERATE_MIXED_PRECISION."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setattr(posbias.precision, "native_bf16", lambda device: (False, "no native bf16"))
    seen = _encoder_autocast(monkeypatch)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny_config(tmp_path, train={"max_steps": 1}, data={"eval_file": None})),
                   encoding="utf-8")
    assert main(["train", "qa", "-c", str(cfg), *option.split()]) == 0
    assert seen and set(seen) == {(False, torch.get_autocast_dtype("cpu"))}
    info = _info(tmp_path / "run")
    assert info["precision"]["precision"] == "fp32" and info["precision"]["source"] == "train.mixed_precision"


def test_without_either_the_default_is_fp32_and_fp8_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    posbias.train(build_config(tiny_config(tmp_path, train={"max_steps": 1}, data={"eval_file": None})),
                  progress=False)
    assert _info(tmp_path / "run")["precision"]["source"] == "default"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "b", train={"max_steps": 1})), encoding="utf-8")
    assert main(["train", "qa", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ACCELERATE_MIXED_PRECISION=fp8" in err and "train.mixed_precision" in err, err
