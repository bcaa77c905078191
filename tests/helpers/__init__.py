"""What test files share besides fixtures: the tiny encoder and config, the bundled demo files, the
CLI in a subprocess (`run_cli`) or in this process for its one-line refusals (`cli_here`), tiny checkpoints and models, scale-relative numeric checks, the interrupting
perturbation of the resume tests; the device rule's constants (`helpers.devices`).

Import from here (`from helpers import tiny_config`): tests/ is on sys.path (pyproject.toml's
`pythonpath`), from every sub-folder. Fixtures live in tests/conftest.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from posbias.config import RESOURCES, build_config

# The rule keeping every test but the `device` ones on the CPU on a GPU box (tiny_config's
# train.device, run_cli's CUDA_VISIBLE_DEVICES): see that module.
from .devices import CPU_ONLY_ENV, DEVICES  # noqa: F401

TINY_ENCODER = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 64, "max_position_embeddings": 512}
# ../shared/data beside the repository (as in CI); tests needing it skip when it is absent.
SHARED_DATA = Path(os.environ.get("POSBIAS_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
DEMO_DEV = str(RESOURCES / "squad_demo" / "dev.json.gz")
DEMO_TRAIN = str(RESOURCES / "squad_demo" / "train.json.gz")
BIN = Path(sys.executable).parent  # the venv's console scripts (posbias, torchrun)


def run_cli(*args, gpu: bool = False, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`posbias ARGS` in a subprocess: one thread, offline, output captured; the GPUs hidden from it
    unless `gpu` (helpers.devices); `env`: more environment variables."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **({} if gpu else CPU_ONLY_ENV), **(env or {})}
    return subprocess.run([str(BIN / "posbias"), *args], capture_output=True, text=True, env=env, timeout=300, **kw)


def cli_here(*args) -> subprocess.CompletedProcess:
    """`posbias ARGS` in this process, its exit code and output captured as `run_cli` returns them: for a
    refusal (an argument, config or file) or a short command whose output and files the test reads, where
    a subprocess would only add a start-up of Python and torch. What only a fresh process shows stays with
    `run_cli`: stdin, signals, plug-ins found through entry points, hidden GPUs, a library writing to the
    process's own stderr. Anything the CLI does not answer propagates and fails the test."""
    import contextlib
    import io

    from posbias.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's errors
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["posbias", *map(str, args)], code or 0, out.getvalue(), err.getvalue())


def tiny_config(tmp_path=None, **sections) -> dict:
    """A tiny-encoder run config dict; `sections` deep-update it."""
    d = {
        "model": {"name_or_path": None, "tokenizer": "tiny", "encoder": dict(TINY_ENCODER)},
        "data": {"train_file": "demo:train", "eval_file": "demo:dev", "max_seq_len": 128, "stride": 48,
                 "max_train_examples": 48, "max_eval_examples": 24},
        # device cpu, not auto: a config a test writes for a subprocess trains on the CPU on a GPU box
        # too (helpers.devices); GPU tests override it with their `device`.
        "train": {"output_dir": str(tmp_path / "run") if tmp_path else "runs/test", "max_steps": 3,
                  "batch_size": 8, "lr": 1e-3, "log_every": 1, "eval_batch_size": 16, "device": "cpu"},
    }
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v}
    return d


def demo_v2_file(tmp_path, n: int):
    """(path, examples): the first `n` bundled dev questions as a SQuAD v2 file, every third one
    unanswerable."""
    import json

    from posbias.qa.readers import read_qa

    examples = read_qa(DEMO_DEV).examples[:n]
    data = [{"title": "t", "paragraphs": [{"context": e.context, "qas": [{
        "id": e.id, "question": e.question, "is_impossible": i % 3 == 0,
        "answers": [] if i % 3 == 0 else [{"text": a.text, "answer_start": a.start} for a in e.answers]}]}]}
        for i, e in enumerate(examples)]
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return path, examples


def train_and_reevaluate(cfg, tmp_path):
    """(training summary, the run's final eval metrics, `posbias.evaluate` of its best/ on the first
    24 demo dev questions) for a run writing to tmp_path / "run"."""
    import json

    import posbias

    summary = posbias.train(cfg, progress=False)
    first = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text(encoding="utf-8"))
    again = posbias.evaluate(tmp_path / "run" / "best", DEMO_DEV, tmp_path / "ev",
                             overrides=["data.max_eval_examples=24"], progress=False)
    return summary, first, again


def save_tiny_checkpoints(root) -> dict:
    """Tiny random posbias checkpoints, untrained (a QA one, SQuAD v1: no null answer, and a tagging
    one with person tags), saved under `root`: {"qa": path, "tagging": path}."""
    from posbias.checkpoint import save_checkpoint
    from posbias.config import config_from
    from posbias.qa.model import build_model as build_qa
    from posbias.tagging.model import build_model as build_tagger
    from posbias.tasks import get_task

    root = Path(root)
    torch.manual_seed(0)
    cfg = build_config(tiny_config())
    tokenizer = get_task("qa").load_tokenizer(cfg)
    save_checkpoint(build_qa(cfg.model, tokenizer, null_answer=False), cfg, tokenizer, root / "qa")
    cfg = config_from("tiny_tagging")
    tokenizer = get_task("tagging").load_tokenizer(cfg)
    save_checkpoint(build_tagger(cfg.model, tokenizer, ["O", "B-person", "I-person"], "iob2"), cfg, tokenizer,
                    root / "tagging")
    return {"qa": str(root / "qa"), "tagging": str(root / "tagging")}


def tiny_model(tokenizer, null_answer=False, head="independent", seed=0):
    from posbias.qa.model import build_model

    torch.manual_seed(seed)
    cfg = build_config(tiny_config(model={"head": head}))
    return build_model(cfg.model, tokenizer, null_answer=null_answer)


def relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected|: an error measured against the tensor's own scale.

    Portable numerics (STYLE.md): float32 kernels differ between CPUs (Intel vs AMD, thread counts)
    in the last bits, so a fixed absolute tolerance is too tight for values of size 1e3 and too
    loose for values of size 1e-6. Scaling by the tensor's magnitude states the claim either way.
    """
    actual = torch.as_tensor(actual).double()
    expected = torch.as_tensor(expected).double()
    if actual.shape != expected.shape:
        raise AssertionError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    scale = expected.abs().max().item() if expected.numel() else 0.0
    err = (actual - expected).abs().max().item() if expected.numel() else 0.0
    return err / scale if scale > 0 else err


def assert_close_to_scale(actual, expected, rel: float, msg: str = "") -> None:
    """Assert max |actual - expected| <= rel * max |expected| (see `relative_error`)."""
    err = relative_error(actual, expected)
    assert err <= rel, f"{msg}: relative error {err:.3g} > {rel:g}"


# A test perturbation that raises KeyboardInterrupt in its `at`-th call (a run killed mid-step),
# for the resume tests of both tasks.
INTERRUPT = {"at": None, "calls": 0}


def _interrupt():
    def apply(batch, gen):
        INTERRUPT["calls"] += 1
        if INTERRUPT["at"] is not None and INTERRUPT["calls"] == INTERRUPT["at"]:
            raise KeyboardInterrupt
        return batch
    return apply


def _register_interrupt():
    from posbias.registry import PERTURBATIONS

    if "_test_interrupt" not in PERTURBATIONS.names():
        PERTURBATIONS.register("_test_interrupt")(_interrupt)


_register_interrupt()
