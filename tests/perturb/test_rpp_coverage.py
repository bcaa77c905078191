"""Which positions training reaches, and the perturbation modes' defaults (issue 29, items 6 and 9).

RPP draws p_r from the paper's interval [l, M - l], so in replace mode a row of l tokens never
trains the positions 1 .. l - 1 where its test sentence sits. The authors' training step always adds
a clean pass (posbias's `augment`), which is now the default for RPP and Context Perturbation;
Random Padding keeps replace (Tao et al. train on the re-padded batch only).
"""
from __future__ import annotations

import pytest
import torch

from posbias.config import build_config, config_from
from posbias.errors import ConfigError
from posbias.perturb import perturbations_by_mode, position_coverage

from helpers import tiny_config

N_ROWS = 5000
M = 512


def lengths(n=N_ROWS, lo=8, hi=40, seed=0):
    """Row lengths (specials included) uniform over lo .. hi."""
    return torch.randint(lo, hi + 1, (n,), generator=torch.Generator().manual_seed(seed))


def coverage(cfg, rows, seed=1):
    replace, augment = perturbations_by_mode(cfg.perturb, cfg)
    return position_coverage(rows, replace, augment, n_positions=M, generator=torch.Generator().manual_seed(seed))


def tagging(perturb, **data):
    return build_config(config_from("tiny_tagging").to_dict() | {"perturb": perturb}, {"data": data} if data else None)


def test_rpp_default_trains_the_base_positions():
    """Position coverage over 5,000 rows of 8-40 tokens, M = 512. The default (RPP's authors' step,
    augment): every row's positions 1 .. l - 1 are trained by its clean pass. Replace (the old
    default): positions 1 .. 7 are never trained, and 8 .. 39 only by shorter rows' shifts."""
    rows = lengths()
    default = coverage(tagging([{"name": "rpp", "max_len": M}]), rows)
    replace = coverage(tagging([{"name": "rpp", "max_len": M, "mode": "replace"}]), rows)
    for p in range(1, 40):
        assert default[p] >= int((rows > p).sum()), p  # every row with a token at p trains p
    assert default[1:8].tolist() == [N_ROWS] * 7  # the clean pass only: p_r >= l >= 8
    assert replace[1:8].tolist() == [0] * 7
    assert default[0] == replace[0] * 2 == 2 * N_ROWS  # [CLS] in each pass
    # Both passes' tokens: clean + shifted, every real token once per pass.
    assert int(default.sum()) == 2 * int(rows.sum()) == 2 * int(replace.sum())
    print("positions 1-10, default:", default[1:11].tolist(), "replace:", replace[1:11].tolist(),
          "positions 100-104, replace:", replace[100:105].tolist())


def test_configs_saved_before_the_default_keep_replace():
    """A saved config without data.perturb_default_mode (a checkpoint's posbias.yaml, a recorded
    run: written before config versions) keeps RPP in replace mode and its hash; the same entry in a
    new config is augment and hashes differently, so an experiment store never takes a recorded
    replace run for an augment one."""
    new = tagging([{"name": "rpp"}])
    old = new.to_dict()
    del old["config_version"], old["data"]["perturb_default_mode"]
    saved = build_config(old, saved=True)
    assert saved.data.perturb_default_mode == "replace" and new.data.perturb_default_mode == "paper"
    assert [len(x) for x in perturbations_by_mode(saved.perturb, saved)] == [1, 0]  # replace
    assert [len(x) for x in perturbations_by_mode(new.perturb, new)] == [0, 1]  # augment
    assert (coverage(saved, lengths(200))[1:8] == 0).all()
    import hashlib
    import json

    recorded = json.loads(json.dumps(old))  # the hash such a run was recorded under: the key did not exist
    for section, key in (("train", "output_dir"), ("train", "device"), ("train", "report_to"),
                         ("train", "eval_batch_tokens"), ("train", "deterministic")):
        recorded[section].pop(key, None)
    from posbias.compat import hash_neutral

    for dotted, value in hash_neutral(type(saved)).items():
        section, key = dotted.split(".", 1)
        if recorded.get(section, {}).get(key, object()) == value:
            del recorded[section][key]
    assert saved.hash() == hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()[:16]
    assert new.hash() != saved.hash()


@pytest.mark.parametrize("perturb, default, modes", [
    ([{"name": "rpp"}], "paper", ["augment"]),
    ([{"name": "random_position_perturbation"}, {"name": "context_perturbation"}], "paper", ["augment", "augment"]),
    ([{"name": "rpp"}], "replace", ["replace"]),
    ([{"name": "rpp", "mode": "replace"}, {"name": "context_perturbation"}], "paper", ["replace", "augment"]),
    ([{"name": "context_perturbation", "mode": "replace"}, {"name": "rpp"}], "augment", ["replace", "augment"]),
])
def test_mode_defaults(perturb, default, modes):
    from posbias.perturb import build_perturbations

    cfg = tagging(perturb, perturb_default_mode=default)
    assert [m for _, m in build_perturbations(cfg.perturb, cfg, with_modes=True)] == modes


def test_random_padding_keeps_replace_and_bad_defaults_are_named():
    from posbias.perturb import build_perturbations

    qa = build_config(tiny_config() | {"perturb": [{"name": "random_padding"}]})
    assert [m for _, m in build_perturbations(qa.perturb, qa, with_modes=True)] == ["replace"]
    qa_aug = build_config(tiny_config() | {"perturb": [{"name": "random_padding"}]},
                          {"data": {"perturb_default_mode": "augment"}})
    assert [m for _, m in build_perturbations(qa_aug.perturb, qa_aug, with_modes=True)] == ["augment"]
    for make in (lambda v: build_config(tiny_config(), {"data": {"perturb_default_mode": v}}),
                 lambda v: tagging([], perturb_default_mode=v)):
        with pytest.raises(ConfigError, match=r"^data\.perturb_default_mode must be one of \['paper', 'replace', "
                                              r"'augment'\], got 'twice'"):
            make("twice")


def test_rpp_then_context_perturbation_in_replace_is_refused():
    """Context Perturbation rebuilds the rows and numbers them afresh: a replace RPP before it was
    silently discarded. Refused, naming both entries; the working orders and modes are accepted."""
    with pytest.raises(ConfigError, match=r"^perturb\[1\]: context_perturbation \(mode replace\) rebuilds the rows .*"
                                          r"perturb\[0\] \(rpp, mode replace\) would never be trained; list "
                                          r"perturb\[1\] first .* perturb\[0\]\.mode or perturb\[1\]\.mode to augment"):
        tagging([{"name": "rpp", "mode": "replace"}, {"name": "context_perturbation", "mode": "replace"}])
    with pytest.raises(ConfigError, match=r"^perturb\[1\]: context_perturbation"):
        tagging([{"name": "rpp"}, {"name": "context_perturbation"}], perturb_default_mode="replace")
    # CP first, then RPP shifts the concatenations; or one of them in augment mode; or the defaults.
    tagging([{"name": "context_perturbation", "mode": "replace"}, {"name": "rpp", "mode": "replace"}])
    tagging([{"name": "rpp", "mode": "replace"}, {"name": "context_perturbation", "mode": "augment"}])
    tagging([{"name": "rpp"}, {"name": "context_perturbation"}])


def test_random_padding_max_len_zero_is_refused():
    """`max_len: 0` used to mean data.max_seq_len silently; null (or leaving it out) is the way."""
    from posbias.perturb import build_perturbations

    with pytest.raises(ConfigError, match=r"^perturb\[0\]\.max_len must be a positive integer .* got 0; "
                                          r"leave it out or set null for data\.max_seq_len"):
        build_config(tiny_config() | {"perturb": [{"name": "random_padding", "max_len": 0}]})
    for spec in ({"name": "random_padding"}, {"name": "random_padding", "max_len": None}):
        cfg = build_config(tiny_config() | {"perturb": [spec]})
        assert build_perturbations(cfg.perturb, cfg)[0].max_len == cfg.data.max_seq_len == 128
    cfg = build_config(tiny_config() | {"perturb": [{"name": "random_padding", "max_len": 100}]})
    assert build_perturbations(cfg.perturb, cfg)[0].max_len == 100


def test_coverage_refuses_positions_past_the_table():
    cfg = tagging([{"name": "rpp", "max_len": M, "mode": "replace"}])
    replace, augment = perturbations_by_mode(cfg.perturb, cfg)
    with pytest.raises(ValueError, match="past the 100-entry position table"):
        position_coverage(lengths(50), replace, augment, n_positions=100, generator=torch.Generator().manual_seed(0))
