"""`model.reinit_positions_from` (posbias.encoders.reinit_positions): the positive control that
re-initialises rear position embeddings. The rows at ids >= N are drawn as the encoder's own init
(N(0, initializer_range)), from their own seeded generator; rows below N, every other weight and the
global RNG stay as they were; the run records what it did in run_info.json; a resumed run ends with
the weights of the uninterrupted one."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

import posbias
from posbias.config import build_config, config_from
from posbias.encoders import REINIT_STREAM, encoder_from_config, position_table, reinit_positions
from posbias.errors import ConfigError
from posbias.relative_position import apply_relative_positions

from helpers import INTERRUPT, TINY_ENCODER, tiny_config

N = 100


def tiny_encoder(initializer_range: float = 0.05, model_type: str = "bert", **extra):
    """A random tiny encoder; an initializer_range other than transformers' 0.02 shows whose std is drawn."""
    spec = {k: v for k, v in TINY_ENCODER.items() if k != "model_type"}
    config = AutoConfig.for_model(model_type, vocab_size=100, initializer_range=initializer_range, **{**spec, **extra})
    torch.manual_seed(0)
    return encoder_from_config(config)


def test_rows_from_n_are_drawn_as_the_embeddings_init_and_rows_below_kept():
    encoder = tiny_encoder(0.05)
    before = copy.deepcopy(encoder.state_dict())
    record = reinit_positions(encoder, N, seed=7)
    table = position_table(encoder).weight.detach()
    old = before["embeddings.position_embeddings.weight"]
    assert torch.equal(table[:N], old[:N])
    assert (table[N:] != old[N:]).all(dim=1).all()  # every re-initialised row differs from the old one
    rows = table[N:].double()  # (412, 32): 13,184 draws
    n, std = rows.numel(), 0.05
    # Tolerances scaled to the std: the sample mean's s.e. is std/sqrt(n), the sample std's std/sqrt(2n).
    assert abs(rows.mean().item()) < 5 * std / n ** 0.5
    assert abs(rows.std().item() - std) < 5 * std / (2 * n) ** 0.5
    assert abs(rows.std().item() - 0.02) > 5 * std / (2 * n) ** 0.5  # transformers' default std would fail
    for name, value in encoder.state_dict().items():  # nothing else touched
        if name != "embeddings.position_embeddings.weight":
            assert torch.equal(value, before[name]), name
    assert record == {"ids": [N, 511], "rows": 412, "init": "normal", "mean": 0.0, "std": 0.05, "seed": 7,
                      "stream": REINIT_STREAM, "padding_id_zero": None}


def test_the_draw_is_fixed_by_the_seed_and_leaves_the_global_rng_alone():
    a, b, c = tiny_encoder(), tiny_encoder(), tiny_encoder()
    rng = torch.get_rng_state()
    reinit_positions(a, N, seed=1)
    assert torch.equal(torch.get_rng_state(), rng)  # head init, dropout and data order as without the option
    reinit_positions(b, N, seed=1)
    reinit_positions(c, N, seed=2)
    ta, tb, tc = (position_table(e).weight.detach() for e in (a, b, c))
    assert torch.equal(ta, tb)
    assert (ta[N:] != tc[N:]).all(dim=1).all()


def test_default_leaves_the_weights_as_loaded():
    encoder = tiny_encoder()
    before = copy.deepcopy(encoder.state_dict())
    assert reinit_positions(encoder, None, seed=1) is None
    after = encoder.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_a_padding_row_in_range_stays_zero():
    """RoBERTa's table has a padding row (id 1), which its init keeps zero."""
    encoder = tiny_encoder(model_type="roberta", pad_token_id=1)
    record = reinit_positions(encoder, 1, seed=3)
    table = position_table(encoder).weight.detach()
    assert record["padding_id_zero"] == 1 and torch.equal(table[1], torch.zeros_like(table[1]))
    assert (table[2:] != 0).all(dim=1).all()


@pytest.mark.parametrize("start", [0, 512, 600])
def test_start_outside_the_table_is_refused_naming_the_key(start):
    with pytest.raises(ConfigError, match=r"model\.reinit_positions_from must be >= 1 and < .*\(512\)"):
        reinit_positions(tiny_encoder(), start, seed=1)


def test_an_encoder_without_an_absolute_table_is_refused_naming_the_key():
    relative = tiny_encoder()
    apply_relative_positions(relative, "relative_key", "model.position_embedding_type")
    with pytest.raises(ConfigError, match=r"^model\.reinit_positions_from: bert uses relative positions"):
        reinit_positions(relative, N, seed=1)
    rotary = tiny_encoder(model_type="roformer", embedding_size=32)
    with pytest.raises(ConfigError, match=r"^model\.reinit_positions_from: roformer uses rotary positions"):
        reinit_positions(rotary, N, seed=1)


@pytest.mark.parametrize("model, match", [
    ({"reinit_positions_from": 0}, r"model\.reinit_positions_from must be >= 1"),
    ({"reinit_positions_from": 512}, r"model\.reinit_positions_from must be < model\.encoder\.max_position_embeddings"),
    ({"reinit_positions_from": 64, "position_embedding_type": "relative_key"},
     r"model\.reinit_positions_from: model\.position_embedding_type relative_key has no absolute"),
])
def test_config_refuses_what_it_can_tell_is_wrong(model, match):
    with pytest.raises(ConfigError, match=match):
        build_config(tiny_config(model=model))


def test_the_default_is_left_out_of_the_hash_and_a_value_is_in_it():
    plain = build_config(tiny_config())
    assert build_config(tiny_config(model={"reinit_positions_from": None})).hash() == plain.hash()
    assert build_config(tiny_config(model={"reinit_positions_from": 64})).hash() != plain.hash()


@pytest.mark.parametrize("preset", ["tiny", "tiny_tagging"])
def test_training_records_the_reinit_in_run_info(preset, tmp_path):
    overrides = [f"train.output_dir={tmp_path / 'run'}", "train.max_steps=2", "train.device=cpu",
                 "data.eval_file=", "model.reinit_positions_from=64"]
    posbias.train(config_from(preset, overrides), progress=False)
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["reinit_positions"] == {"ids": [64, 511], "rows": 448, "init": "normal", "mean": 0.0, "std": 0.02,
                                        "seed": 42, "stream": REINIT_STREAM, "padding_id_zero": None}


def test_a_run_without_the_option_records_nothing(tmp_path):
    overrides = [f"train.output_dir={tmp_path / 'run'}", "train.max_steps=1", "train.device=cpu", "data.eval_file="]
    posbias.train(config_from("tiny_tagging", overrides), progress=False)
    assert "reinit_positions" not in json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))


def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(tmp_path):
    """The resumed attempt re-initialises its fresh model too, but its checkpoint then replaces every
    weight: the trained rows continue, not a second draw."""
    sections = dict(train={"max_steps": 3, "save_every": 1}, data={"eval_file": None},
                    model={"reinit_positions_from": 64})
    cfg = build_config(tiny_config(tmp_path, **sections) | {"perturb": [{"name": "_test_interrupt"}]})
    INTERRUPT.update(at=2, calls=0)  # dies inside step 2, after step 1 was checkpointed
    with pytest.raises(KeyboardInterrupt):
        posbias.train(cfg, progress=False)
    INTERRUPT.update(at=None, calls=0)
    posbias.train(cfg, resume="auto", progress=False)
    fresh = build_config(tiny_config(tmp_path / "b", **sections) | {"perturb": [{"name": "_test_interrupt"}]})
    posbias.train(fresh, progress=False)
    a = load_file(str(tmp_path / "run" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "best" / "model.safetensors"))
    # Exact equality: the same kernels in one process with one thread (conftest), as the resume tests.
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
