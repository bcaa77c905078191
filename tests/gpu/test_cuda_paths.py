"""Every device-dependent path of training, evaluation and diagnosis runs on the `device` fixture's
device (cpu; cuda where torch sees a GPU, marked `gpu`): precisions, heads, relative positions,
perturbations, de-biasing, resume, evaluate and diagnose. Each case trains a tiny random encoder for
two steps on 16 examples and checks that the run happened on that device: run_info.json's
hardware.device, finite losses, the model's parameters on the device after training, and metrics.
What each path computes is tested elsewhere on the CPU; here only that it runs on the device.
"""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import posbias
from posbias.config import build_config, config_from
from posbias.tasks import get_task

from helpers import DEMO_DEV, INTERRUPT, TINY_ENCODER, assert_close_to_scale, tiny_config

QUICK = {"data": {"max_train_examples": 16, "max_eval_examples": 8}, "train": {"max_steps": 2, "eval_batch_size": 8}}
TAGGING_EVAL = ["data.max_eval_examples=16"]


def qa_config(tmp_path, device, perturb=(), **sections) -> dict:
    """tiny_config on `device` with QUICK's sizes; `sections` deep-update it."""
    d = tiny_config(tmp_path, **{k: {**QUICK.get(k, {}), **sections.get(k, {})}
                                 for k in {*QUICK, *sections}})
    d["train"]["device"] = device
    return {**d, "perturb": list(perturb)}


def tagging_config(tmp_path, device, perturb=(), **sections) -> dict:
    """The tiny_tagging preset on `device`, 2 steps on 16 sentences; `sections` deep-update it."""
    d = config_from("tiny_tagging").to_dict()
    d["data"].update(max_train_examples=16, max_eval_examples=16)
    d["train"].update(output_dir=str(tmp_path / "run"), max_steps=2, device=device, log_every=1, eval_batch_size=16)
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v}
    return {**d, "perturb": list(perturb)}


def train_on(device, d: dict, monkeypatch) -> dict:
    """Train config dict `d`; assert the run happened on `device`: run_info's hardware.device, every
    logged loss finite, every parameter of the trained model on the device. Returns the summary,
    run_info and the train log."""
    cfg = build_config(d)
    task = get_task(cfg.task)
    built = []

    def build_model(*args, **kw):  # the model object the loop trains, to look at its parameters after
        built.append(task.__class__.build_model(task, *args, **kw))
        return built[-1]

    monkeypatch.setattr(task, "build_model", build_model)
    summary = posbias.train(cfg, progress=False)
    run = Path(cfg.train.output_dir)
    info = read_json(run / "run_info.json")
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert info["status"] == "finished" and info["hardware"]["device"].startswith(device), info["hardware"]
    assert len(log) == cfg.train.max_steps and all(math.isfinite(r["loss"]) for r in log), log
    (model,) = built
    assert {p.device.type for p in model.parameters()} == {device}
    assert {b.device.type for b in model.buffers()} <= {device}
    if cfg.data.eval_file:
        assert summary["best_metric"] is not None and math.isfinite(summary["best_metric"]), summary
        assert summary["eval"], summary
    return {"summary": summary, "info": info, "log": log}


def read_json(path):
    return json.loads(path.read_text(encoding="utf-8"))


def assert_eval_on(out, device, precision="fp32"):
    """An evaluate / diagnose output folder that says it ran on `device` in `precision`."""
    info = read_json(out / "run_info.json")
    assert info["hardware"]["device"].startswith(device), info["hardware"]
    assert info["precision"]["precision"] == precision, info["precision"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """get(device, task) -> a trained tiny checkpoint (best/) of that task, trained on that device
    once per module."""
    done = {}

    def get(device, task):
        if (device, task) not in done:
            out = tmp_path_factory.mktemp(f"{task}-{device}")
            d = (qa_config(out, device, data={"eval_file": None}) if task == "qa"
                 else tagging_config(out, device, data={"eval_file": None}))
            posbias.train(build_config(d), progress=False)
            done[device, task] = out / "run" / "best"
        return done[device, task]

    return get


# ---- training precisions: accelerate's autocast (+ GradScaler for fp16 on CUDA)


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
@pytest.mark.parametrize("task", ["qa", "tagging"])
def test_training_precision_on_device(device, task, precision, tmp_path, monkeypatch):
    config = qa_config if task == "qa" else tagging_config
    run = train_on(device, config(tmp_path, device, train={"mixed_precision": precision}), monkeypatch)
    assert run["info"]["precision"]["precision"] == {"no": "fp32"}.get(precision, precision)


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_accumulation_and_clipping_on_device(device, precision, tmp_path, monkeypatch):
    """Gradient accumulation (no_sync) and clipping (fp16 on CUDA: the scaler unscales first)."""
    d = qa_config(tmp_path, device, train={"mixed_precision": precision, "grad_accum": 2, "max_grad_norm": 1.0,
                                           "batch_size": 4})
    run = train_on(device, d, monkeypatch)
    assert run["summary"]["steps"] == 2


# ---- evaluation precisions: evaluate and predict a checkpoint under autocast on the device


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_qa_eval_precision_on_device(device, precision, checkpoints, tmp_path):
    over = [f"train.device={device}", f"train.eval_precision={precision}", "data.max_eval_examples=8"]
    metrics = posbias.evaluate(checkpoints(device, "qa"), DEMO_DEV, tmp_path / "ev", overrides=over, progress=False)
    assert {"f1", "exact_match"} <= set(metrics) and math.isfinite(metrics["f1"])
    assert_eval_on(tmp_path / "ev", device, precision)
    answer = posbias.predict(checkpoints(device, "qa"), question="Who founded it?",
                             context="The company was founded by Ada Lovelace in London.", overrides=over)
    assert len(answer) == 1 and all(math.isfinite(a["probability"]) for a in answer.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_tagging_eval_precision_on_device(device, precision, checkpoints, tmp_path):
    over = [f"train.device={device}", f"train.eval_precision={precision}", *TAGGING_EVAL]
    metrics = posbias.evaluate(checkpoints(device, "tagging"), "demo:wnut-dev", tmp_path / "ev", overrides=over,
                               progress=False)
    assert metrics and "f1" in metrics
    assert_eval_on(tmp_path / "ev", device, precision)


# ---- span heads (MaP: VCP and the span matrix, sampled and exact; DyReF and its attention masks)

HEADS = {
    "independent": ("independent", {}),
    "conditional_pointer": ("conditional_pointer", {}),
    "matrix_sampled": ("matrix", {"direction": "forward"}),
    "matrix_exact": ("matrix", {"direction": "forward", "training": "exact", "inference": "exact"}),
    "matrix_backward_block": ("matrix", {"direction": "backward", "normalization": "block"}),
    "matrix_ensemble": ("matrix", {"direction": "both", "ensemble": True}),
    **{f"dynamic_query_{mask}": ("dynamic_query", {"attention": mask, "query_pooling": "max"})
       for mask in ("full", "bidirectional", "causal", "independent")},
    "dynamic_query_context_softmax": ("dynamic_query", {"query_pooling": "mean", "softmax_over": "context"}),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_head_trains_and_evaluates_on_device(device, name, tmp_path, monkeypatch):
    head, options = HEADS[name]
    run = train_on(device, qa_config(tmp_path, device, model={"head": head, "head_options": options}), monkeypatch)
    assert set(run["summary"]["eval"]) >= {"f1", "exact_match"}


def test_v2_null_answers_on_device(device, tmp_path, monkeypatch):
    """SQuAD v2 (a [CLS] null answer, null_odds) with the conditional pointer head."""
    from helpers import demo_v2_file

    path, _ = demo_v2_file(tmp_path, 16)
    d = qa_config(tmp_path, device, model={"head": "conditional_pointer"},
                  data={"train_file": str(path), "eval_file": str(path)})
    run = train_on(device, d, monkeypatch)
    assert "HasAns_f1" in run["summary"]["eval"] or "NoAns_f1" in run["summary"]["eval"], run["summary"]["eval"]


# ---- relative position embeddings (posbias.relative_position replaces BERT's attention)


@pytest.mark.parametrize("task,kind", [("qa", "relative_key"), ("qa", "relative_key_query"),
                                       ("tagging", "relative_key")])
def test_relative_positions_on_device(device, task, kind, tmp_path, monkeypatch):
    config = qa_config if task == "qa" else tagging_config
    run = train_on(device, config(tmp_path, device, model={"position_embedding_type": kind}), monkeypatch)
    assert run["summary"]["steps"] == 2


# ---- training-time perturbations (built on the CPU, then moved with the batch)

PERTURBATIONS = {
    "qa-random_padding": ("qa", {"name": "random_padding"}),
    "qa-rpp_augment": ("qa", {"name": "rpp", "mode": "augment"}),
    "qa-randomized_positions": ("qa", {"name": "randomized_positions"}),
    "tagging-rpp_augment": ("tagging", {"name": "random_position_perturbation", "mode": "augment"}),
    "tagging-random_padding": ("tagging", {"name": "random_padding"}),
    "tagging-randomized_positions": ("tagging", {"name": "randomized_positions"}),
    "tagging-context_perturbation": ("tagging", {"name": "context_perturbation"}),
    "tagging-context_perturbation_replace": ("tagging", {"name": "context_perturbation", "mode": "replace"}),
}


@pytest.mark.parametrize("name", list(PERTURBATIONS))
def test_perturbation_trains_on_device(device, name, tmp_path, monkeypatch):
    task, spec = PERTURBATIONS[name]
    config = qa_config if task == "qa" else tagging_config
    train_on(device, config(tmp_path, device, perturb=[spec]), monkeypatch)


def test_dyref_with_random_padding_on_device(device, tmp_path, monkeypatch):
    d = qa_config(tmp_path, device, perturb=[{"name": "random_padding"}], model={"head": "dynamic_query"})
    train_on(device, d, monkeypatch)


# ---- de-biasing objectives (the prior's tables move to the batch's device)

DEBIAS = {
    "bias_product": ("independent", {"method": "bias_product"}),
    "bias_product_sentence": ("independent", {"method": "bias_product", "prior": "sentence"}),
    "bias_product_probability": ("independent", {"method": "bias_product", "bias_term": "probability"}),
    "learned_mixin": ("independent", {"method": "learned_mixin"}),
    "learned_mixin_max_dyref": ("dynamic_query", {"method": "learned_mixin", "gate": "max"}),
    "learned_mixin_h_pointer": ("conditional_pointer",
                                {"method": "learned_mixin_h", "prior": "sentence", "entropy_weight": 0.5}),
    "entropy": ("independent", {"method": "entropy"}),
}


@pytest.mark.parametrize("name", list(DEBIAS))
def test_debias_trains_and_evaluates_on_device(device, name, tmp_path, monkeypatch):
    head, debias = DEBIAS[name]
    run = train_on(device, qa_config(tmp_path, device, model={"head": head}, train={"debias": debias}), monkeypatch)
    assert run["info"]["debias"]["method"] == debias["method"]
    if debias["method"].startswith("learned_mixin"):  # the gate ran and was logged
        assert all(r["stats"]["debias_gate_mean"] > 0 for r in run["log"])


# ---- resume: a run killed in step 3 and resumed ends where an uninterrupted run ends

# The resume state holds the CPU RNG (torch.get_rng_state) but not yet the CUDA one, a known defect
# (posbias/training.py, `_save_last` saves and `_load_resume` restores python, numpy and torch CPU
# states only): a resumed CUDA run draws other dropout masks than the uninterrupted one (on an
# H200: relative weight differences up to 0.38 after 4 steps). Without dropout it ends where the
# uninterrupted run ends (bit for bit on an H200). So the dropout case is an expected failure on
# CUDA, strict: it starts passing, and must lose its marker, when the CUDA RNG state is saved.
NO_DROPOUT = {**TINY_ENCODER, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@pytest.mark.parametrize("dropout", [False, True], ids=["no_dropout", "dropout"])
def test_resume_on_device_ends_where_an_uninterrupted_run_ends(device, dropout, tmp_path):
    # With dropout on CUDA this failed until the checkpoint kept the device's generator state (on an
    # H200, 2026-11-26: no weight tensor equal, up to 0.38 apart relative).
    encoder = TINY_ENCODER if dropout else NO_DROPOUT
    d = qa_config(tmp_path, device, perturb=[{"name": "_test_interrupt"}], model={"encoder": encoder},
                  data={"eval_file": None}, train={"max_steps": 4, "save_every": 1})
    cfg = build_config(d)
    INTERRUPT.update(at=3, calls=0)  # dies inside step 3, after steps 1-2 were checkpointed
    try:
        with pytest.raises(KeyboardInterrupt):
            posbias.train(cfg, progress=False)
        assert read_json(tmp_path / "run" / "checkpoints" / "last" / "trainer_state.json")["global_step"] == 2
        INTERRUPT.update(at=None, calls=0)
        posbias.train(cfg, resume="auto", progress=False)
        assert INTERRUPT["calls"] == 2  # only steps 3 and 4 ran
    finally:
        INTERRUPT.update(at=None, calls=0)
    info = read_json(tmp_path / "run" / "run_info.json")
    assert info["status"] == "finished" and info["resumed_at_step"] == 2
    assert info["hardware"]["device"].startswith(device)
    fresh = qa_config(tmp_path / "b", device, perturb=[{"name": "_test_interrupt"}], model={"encoder": encoder},
                      data={"eval_file": None}, train={"max_steps": 4, "save_every": 1})
    posbias.train(build_config(fresh), progress=False)
    a = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "best" / "model.safetensors"))
    assert a.keys() == b.keys()
    # The CPU reproduces the uninterrupted run bit for bit (one process, one thread, same kernels).
    # CUDA kernels need not (atomic adds may sum in another order from call to call; on an H200
    # these runs were bit-equal), so there the weights agree to a tolerance scaled to each tensor.
    for k in a:
        if device == "cpu":
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
        else:
            assert_close_to_scale(a[k], b[k], rel=1e-3, msg=k)
    losses = lambda run: [r["loss"] for r in  # noqa: E731
                          map(json.loads, (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines())]
    torch.testing.assert_close(torch.tensor(losses(tmp_path / "run")), torch.tensor(losses(tmp_path / "b" / "run")),
                               rtol=0 if device == "cpu" else 1e-4, atol=0 if device == "cpu" else 1e-6)


# ---- evaluate and diagnose a checkpoint on the device (the CLI's --device)


def test_qa_diagnose_on_device(device, checkpoints, tmp_path):
    over = [f"train.device={device}", "data.max_eval_examples=24"]
    res = posbias.diagnose(checkpoints(device, "qa"), DEMO_DEV, tmp_path / "dg", overrides=over, progress=False,
                           bootstrap_samples=0)
    assert res and (tmp_path / "dg" / "diagnosis.json").is_file()
    assert_eval_on(tmp_path / "dg", device)


def test_tagging_diagnose_on_device(device, checkpoints, tmp_path):
    over = [f"train.device={device}", *TAGGING_EVAL]
    res = posbias.diagnose(checkpoints(device, "tagging"), "demo:wnut-dev", tmp_path / "dg", overrides=over,
                           progress=False, bootstrap_samples=0, k_max=2, quantiles=None)
    assert res and (tmp_path / "dg" / "diagnosis.json").is_file()
    assert_eval_on(tmp_path / "dg", device)


def test_checkpoint_trained_on_one_device_evaluates_on_the_cpu(device, checkpoints, tmp_path):
    """A checkpoint written from the device loads anywhere (its tensors saved from the device)."""
    over = ["train.device=cpu", "data.max_eval_examples=8"]
    metrics = posbias.evaluate(checkpoints(device, "qa"), DEMO_DEV, tmp_path / "ev", overrides=over, progress=False)
    assert math.isfinite(metrics["f1"])
    assert_eval_on(tmp_path / "ev", "cpu")
