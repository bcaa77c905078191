"""posbias.relative_position: transformers 4.x's relative_key / relative_key_query attention, re-provided.

Self-contained (no tests/helpers), so it runs while the rest of posbias is mid-refactor. Numeric
claims are checked in float64 against the tensor's own scale (max|a-b| <= 1e-10 * max|b|), which
holds on any CPU and thread count; each such check is paired with a variant that must fail it.
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel


def _import_relative_position():
    """posbias.relative_position, even if `posbias/__init__` (api, cli, ...) is temporarily broken."""
    try:
        import posbias  # noqa: F401
    except Exception:  # load the package's modules without running its __init__
        pkg = types.ModuleType("posbias")
        pkg.__path__ = [str(Path(__file__).resolve().parents[2] / "posbias")]
        sys.modules["posbias"] = pkg
    return importlib.import_module("posbias.relative_position")


rp = _import_relative_position()
ConfigError = importlib.import_module("posbias.errors").ConfigError
KINDS = ("relative_key", "relative_key_query")
N_POS = 64
TOL = 1e-10


def relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected|."""
    actual, expected = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    return err / scale if scale > 0 else err


def tiny_config(model_type="bert", attn="sdpa", **over):
    kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=120,
              max_position_embeddings=N_POS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if model_type == "roberta":
        kw.update(pad_token_id=1, max_position_embeddings=N_POS + 2)
    kw.update(over)
    return AutoConfig.for_model(model_type, attn_implementation=attn, **kw)


def build(config, seed=0):
    torch.manual_seed(seed)
    try:
        model = AutoModel.from_config(config, add_pooling_layer=False)
    except TypeError:  # ELECTRA has no pooler option
        model = AutoModel.from_config(config)
    return model.eval()


def patched(kind, model_type="bert", attn="sdpa", seed=0, **over):
    model = build(tiny_config(model_type, attn, **over), seed)
    rp.apply_relative_positions(model, kind, "model.position_embedding_type")
    return model


def padded_batch(lengths, total, left=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        span = slice(total - n, total) if left else slice(0, n)
        ids[row, span] = torch.randint(5, 120, (n,), generator=g)
        mask[row, span] = 1
    return ids, mask


# --- against the textbook formulas -------------------------------------------------------------

def textbook_attention(attn, x, keep, kind):
    """Shaw et al. / Huang et al. with explicit loops: e_ij = (q_i.k_j + q_i.a_ij [+ k_j.a_ij]) / sqrt(d),
    a softmax over the real keys j only, out_i = sum_j alpha_ij v_j. Returns (output, probs)."""
    b, s, _ = x.shape
    h, d = attn.num_attention_heads, attn.attention_head_size
    table = attn.distance_embedding.weight
    out = torch.zeros(b, s, h * d, dtype=x.dtype)
    probs = torch.zeros(b, h, s, s, dtype=x.dtype)
    for n in range(b):
        for head in range(h):
            rows = slice(head * d, (head + 1) * d)
            proj = {name: x[n] @ lin.weight[rows].T + lin.bias[rows]
                    for name, lin in (("q", attn.query), ("k", attn.key), ("v", attn.value))}
            q, k, v = proj["q"], proj["k"], proj["v"]
            for i in range(s):
                js = [j for j in range(s) if keep[n, j]]
                e = []
                for j in js:
                    a_ij = table[i - j + N_POS - 1]
                    e_ij = q[i] @ k[j] + q[i] @ a_ij
                    if kind == "relative_key_query":
                        e_ij = e_ij + k[j] @ a_ij
                    e.append(e_ij / d ** 0.5)
                alpha = torch.softmax(torch.stack(e), dim=0)
                for a, j in zip(alpha, js):
                    probs[n, head, i, j] = a
                    out[n, i, rows] += a * v[j]
    return out, probs


class FlippedSign(rp.RelativePositionSelfAttention):
    """A deliberately wrong variant: distance j - i instead of i - j."""

    def distance_embeddings(self, l, r, device, dtype):
        distance = torch.arange(r, device=device)[None, :] - torch.arange(l, device=device)[:, None]
        return self.distance_embedding(distance + self.max_position_embeddings - 1).to(dtype)


def layer0(kind):
    """Layer 0's patched self-attention (float64), its original module, and a padded input."""
    model = build(tiny_config()).double()
    original = model.encoder.layer[0].attention.self
    rp.apply_relative_positions(model, kind, "model.position_embedding_type")
    attn = model.encoder.layer[0].attention.self
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # N(0, 1) rather than N(0, 0.02): the relative terms weigh as much as q.k
        attn.distance_embedding.weight.copy_(torch.randn(attn.distance_embedding.weight.shape, generator=g))
    x = torch.randn(2, 7, 32, dtype=torch.float64, generator=g)
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3]).bool()
    return attn, original, x, keep


def mask_forms(keep):
    """The masks transformers 5.23 hands a self-attention module: sdpa (boolean 4-D), eager
    (additive float 4-D), flash attention (the raw 2-D padding mask)."""
    bool4 = keep[:, None, None, :].expand(-1, 1, keep.shape[1], -1)
    eager = torch.zeros(bool4.shape, dtype=torch.float64).masked_fill(~bool4, torch.finfo(torch.float64).min)
    return {"sdpa": bool4, "eager": eager, "2d": keep.long()}


@pytest.mark.parametrize("kind", KINDS)
def test_matches_textbook_formula_with_padding(kind):
    attn, _, x, keep = layer0(kind)
    ref_out, ref_probs = textbook_attention(attn, x, keep, kind)
    for form, mask in mask_forms(keep).items():
        with torch.no_grad():
            out, probs = attn(x, attention_mask=mask)
        assert out.shape == (2, 7, 32) and probs.shape == (2, 4, 7, 7)
        assert relative_error(out, ref_out) <= TOL, form
        assert relative_error(probs, ref_probs) <= TOL, form
        assert (probs[1, :, :, 4:] == 0).all(), f"{form}: a padded key got attention"
    # No mask at all (sdpa without padding) on the unpadded row.
    with torch.no_grad():
        out, _ = attn(x[:1])
    assert relative_error(out, ref_out[:1]) <= TOL


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_distance_sign_does_not_match(kind):
    attn, original, x, keep = layer0(kind)
    wrong = FlippedSign(original, kind, N_POS, 0.02).double().eval()
    wrong.distance_embedding.load_state_dict(attn.distance_embedding.state_dict())
    ref_out, _ = textbook_attention(attn, x, keep, kind)
    mask = mask_forms(keep)["sdpa"]
    with torch.no_grad():
        right_err = relative_error(attn(x, attention_mask=mask)[0], ref_out)
        wrong_err = relative_error(wrong(x, attention_mask=mask)[0], ref_out)
    print(f"{kind}: relative error correct {right_err:.2e}, sign flipped {wrong_err:.2e}")
    assert right_err <= TOL < 1e-3 < wrong_err


def test_boolean_mask_is_never_added_as_is():
    keep = torch.tensor([[True, False]])[:, None, None, :]
    add = rp.additive_mask(keep, torch.float32)
    assert add.dtype == torch.float32
    # the most negative float32 that bf16 also holds (`precision.mask_min`), not float32's minimum
    assert add.flatten().tolist() == [0.0, torch.finfo(torch.bfloat16).min]
    assert rp.additive_mask(None, torch.float32) is None
    assert rp.additive_mask(torch.tensor([[1, 0]]), torch.float64).shape == (1, 1, 1, 2)


# --- whole encoders ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_sdpa_and_eager_agree_and_match_unpadded(kind):
    sdpa = patched(kind, attn="sdpa").double()
    eager = patched(kind, attn="eager", seed=5).double()
    eager.load_state_dict(sdpa.state_dict())
    seen = {}

    def record(name):
        def hook(module, args, kwargs):
            seen.setdefault(name, kwargs["attention_mask"])  # returns None: the call is unchanged
        return hook

    for name, model in (("sdpa", sdpa), ("eager", eager)):
        model.encoder.layer[0].attention.self.register_forward_pre_hook(record(name), with_kwargs=True)
    lengths = [9, 6, 3]
    for left in (False, True):
        ids, mask = padded_batch(lengths, 9, left=left)
        seen.clear()
        with torch.no_grad():
            out_s = sdpa(input_ids=ids, attention_mask=mask).last_hidden_state
            out_e = eager(input_ids=ids, attention_mask=mask).last_hidden_state
        # The two paths really hand in different masks: boolean vs additive float.
        assert seen["sdpa"].dtype == torch.bool and seen["eager"].dtype == torch.float64
        assert relative_error(out_s, out_e) <= TOL
        for row, n in enumerate(lengths):
            real = mask[row].bool()
            with torch.no_grad():
                alone = sdpa(input_ids=ids[row:row + 1, real]).last_hidden_state[0]
            assert relative_error(out_s[row, real], alone) <= TOL, (left, row)


@pytest.mark.parametrize("kind", KINDS)
def test_position_ids_no_longer_matter(kind):
    ids, mask = padded_batch([8, 5], 8)
    pos = torch.arange(8).expand(2, -1)
    for relative in (True, False):
        model = build(tiny_config()).double()
        if relative:
            rp.apply_relative_positions(model, kind, "model.position_embedding_type")
        with torch.no_grad():
            a = model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
            b = model(input_ids=ids, attention_mask=mask, position_ids=pos + 17).last_hidden_state
        err = relative_error(b, a)
        assert (err <= TOL) if relative else (err > 1e-3), (relative, err)


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra", "ernie"])
def test_supported_encoders_train(model_type):
    kind = "relative_key_query"
    model = build(tiny_config(model_type))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rp.apply_relative_positions(model, kind, "model.position_embedding_type")
    assert model.config.position_embedding_type == kind and rp.relative_kind(model.config) == kind
    after = model.state_dict()
    # Pretrained weights keep their keys and values; only the absolute table is gone.
    assert set(before) - set(after) == {"embeddings.position_embeddings.weight"}
    assert all(torch.equal(after[k], v) for k, v in before.items() if k in after)
    assert "encoder.layer.0.attention.self.query.weight" in after
    assert sum(isinstance(m, rp.RelativePositionSelfAttention) for m in model.modules()) == 2

    model.train()
    ids, mask = padded_batch([10, 7], 10)
    model(input_ids=ids, attention_mask=mask).last_hidden_state.pow(2).mean().backward()
    for layer in model.encoder.layer:
        grad = layer.attention.self.distance_embedding.weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.mark.parametrize("model_type, over", [
    ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=120, n_positions=N_POS, bos_token_id=0,
                  eos_token_id=0)),
    ("roformer", dict(hidden_size=32, embedding_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, vocab_size=120, max_position_embeddings=N_POS)),
])
def test_other_encoders_are_refused(model_type, over):
    model = build(AutoConfig.for_model(model_type, **over))
    with pytest.raises(ConfigError, match=r"^model\.position_embedding_type: .*bert, roberta, electra, ernie"):
        rp.apply_relative_positions(model, "relative_key", "model.position_embedding_type")
    assert rp.relative_kind(model.config) is None  # nothing was changed


def test_unknown_kind_and_decoder_are_refused():
    model = build(tiny_config())
    with pytest.raises(ConfigError, match=r"^model\.position_embedding_type: unknown .*'rotary'"):
        rp.apply_relative_positions(model, "rotary", "model.position_embedding_type")
    decoder = build(tiny_config(is_decoder=True))
    with pytest.raises(ConfigError, match=r"^config\.json: .*is_decoder"):
        rp.apply_relative_positions(decoder, "relative_key", "config.json")


def test_relative_kind():
    config = tiny_config()
    assert rp.relative_kind(config) is None
    for kind in KINDS:
        config.position_embedding_type = kind
        assert rp.relative_kind(config) == kind
    config.position_embedding_type = "absolute"
    assert rp.relative_kind(config) is None


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trip(kind, tmp_path):
    model = patched(kind).double()
    state = model.state_dict()
    assert "encoder.layer.1.attention.self.distance_embedding.weight" in state
    assert state["encoder.layer.1.attention.self.distance_embedding.weight"].shape == (2 * N_POS - 1, 8)
    model.config.save_pretrained(tmp_path)  # config.json carries position_embedding_type
    config = AutoConfig.from_pretrained(tmp_path)
    assert rp.relative_kind(config) == kind

    fresh = build(config, seed=9).double()
    rp.apply_relative_positions(fresh, rp.relative_kind(config), "config.json")
    fresh.load_state_dict(state, strict=True)
    ids, mask = padded_batch([8, 5], 8)
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).last_hidden_state
        b = fresh(input_ids=ids, attention_mask=mask).last_hidden_state
    assert relative_error(b, a) <= TOL


def test_applying_twice_switches_kind_and_keeps_weights():
    model = patched("relative_key")
    attn = model.encoder.layer[0].attention.self
    table = attn.distance_embedding.weight.detach().clone()
    rp.apply_relative_positions(model, "relative_key_query", "config.json")
    assert model.encoder.layer[0].attention.self is attn
    assert attn.position_embedding_type == "relative_key_query" == model.config.position_embedding_type
    assert torch.equal(attn.distance_embedding.weight, table)


def test_longer_than_the_table_raises():
    model = patched("relative_key")
    ids = torch.randint(5, 120, (1, N_POS + 1))
    zeros = torch.zeros_like(ids)
    with torch.no_grad():
        model(input_ids=ids[:, :N_POS], token_type_ids=zeros[:, :N_POS], position_ids=zeros[:, :N_POS])
        with pytest.raises(ValueError, match=f"max_position_embeddings={N_POS} tokens, got {N_POS + 1}"):
            model(input_ids=ids, token_type_ids=zeros, position_ids=zeros)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_longer_than_the_table_raises_before_the_embeddings(model_type):
    """Plain input_ids (or inputs_embeds) past the table: the documented ValueError, raised before
    transformers 5's embeddings slice their max_position_embeddings-long id buffers (which failed
    with a shape error from inside the embeddings)."""
    model = patched("relative_key_query", model_type=model_type)
    n = model.config.max_position_embeddings
    ids = torch.randint(5, 120, (2, n + 3))
    message = f"relative_key_query attention covers sequences of at most max_position_embeddings={n} tokens, got {n + 3}"
    with torch.no_grad():
        with pytest.raises(ValueError, match=message):
            model(input_ids=ids)
        with pytest.raises(ValueError, match=message):
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        with pytest.raises(ValueError, match=message):
            model(inputs_embeds=model.embeddings.word_embeddings(ids))
        model(input_ids=ids[:, : n - 2])  # within the table: runs
    rp.apply_relative_positions(model, "relative_key", "config.json")  # applying again: one check, the new kind
    assert len(model.embeddings._forward_pre_hooks) == 1
    with torch.no_grad(), pytest.raises(ValueError, match="^relative_key attention covers"):
        model(input_ids=ids)
    import pickle

    copy = pickle.loads(pickle.dumps(model))  # the check is picklable, and travels with the model
    with torch.no_grad(), pytest.raises(ValueError, match="^relative_key attention covers"):
        copy(input_ids=ids)


def test_cross_attention_and_caches_are_refused():
    attn = patched("relative_key").encoder.layer[0].attention.self
    x = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match="cross-attention"):
        attn(x, encoder_hidden_states=x)
    with pytest.raises(ValueError, match="caches"):
        attn(x, past_key_values=object())
    with pytest.raises(ValueError, match="caches"):
        attn(x, cache=object())  # transformers >= 5.24's name for it


def test_transformers_outside_the_tested_range_is_refused_when_used(monkeypatch):
    """Installing posbias pins no transformers release: the relative attention checks it on use."""
    from posbias.relative_position import ALLOW_UNTESTED, TESTED_TRANSFORMERS, check_transformers_version

    monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    low, high = TESTED_TRANSFORMERS
    for ok in (f"{low}.0", f"{high}.0", f"{high}.7", f"{high}.1.dev0"):
        check_transformers_version("model.position_embedding_type", ok)
    major, minor = map(int, high.split("."))
    for bad in ("4.57.6", f"{major}.{minor + 1}.0", f"{major + 1}.0.0"):
        with pytest.raises(ConfigError, match=rf"model.position_embedding_type: .*tested with transformers "
                                              rf"{low} to {high}.x; the installed transformers is {bad}\."):
            check_transformers_version("model.position_embedding_type", bad)
    monkeypatch.setenv(ALLOW_UNTESTED, "1")
    check_transformers_version("model.position_embedding_type", f"{major}.{minor + 1}.0")
