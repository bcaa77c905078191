"""Duplicated test sets and F1(α) (token-positional-bias paper §3.2): bookkeeping, the fixed subset,
shift mode, consistency, the diagnose report on posbias and Hugging Face checkpoints."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import posbias
from posbias.config import RESOURCES, resolve_path
from posbias.errors import ConfigError
from posbias.tagging import duplicated as D
from posbias.tagging.examples import TaggingDataset, TaggingExample
from posbias.tagging.features import separator_id, special_tokens
from posbias.tagging.inputs import tagging_tokenizer

from helpers import cli_here

WORDS = {"john": "B-PER", "york": "I-PER", "visited": "O", "london": "B-LOC", "berlin": "B-LOC", "the": "O",
         "city": "O", "said": "O", "she": "O", "went": "O", "to": "O", "new": "B-ORG"}
LABELS = ["O", "B-LOC", "B-ORG", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def wordpiece():
    return tagging_tokenizer(str(RESOURCES / "tiny_tokenizer"))


class PositionOracle(torch.nn.Module):
    """A tagger with a known, sharp position bias: each token's gold label (looked up by token id)
    while its position id is below `cutoff`, `O` from there on. The position ids are the batch's
    (shift mode) or counted over the attention mask, as posbias's models do."""

    def __init__(self, tokenizer, cutoff=10**9, n_pos=512):
        super().__init__()
        table = torch.zeros(len(tokenizer), dtype=torch.long)
        for w, t in WORDS.items():
            table[tokenizer.convert_tokens_to_ids(w)] = LABELS.index(t)
        self.register_buffer("table", table)
        self.cutoff, self.labels, self.scheme = cutoff, LABELS, "iob2"
        self.encoder = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=n_pos, model_type="bert"))
        self._inputs = SimpleNamespace(positions=True)
        self.position_base = self.position_pad = 0
        self.seen_lengths = []

    def forward(self, batch):
        mask = batch["attention_mask"]
        pos = batch.get("position_ids")
        if pos is None:
            pos = mask.cumsum(-1) - 1
        self.seen_lengths += mask.sum(-1).tolist()
        label = self.table[batch["input_ids"]].masked_fill(pos >= self.cutoff, 0)
        return {"logits": torch.nn.functional.one_hot(label, len(LABELS)).float()}


def sentences(n=12, length=5, seed=0):
    """Sentences of `length` one-token words with entity tags valid in IOB2 (york only after john)."""
    rng = np.random.default_rng(seed)
    plain = [w for w in WORDS if w not in ("york",)]
    out = []
    for i in range(n):
        words = [str(w) for w in rng.choice(plain, size=length)]
        for j in range(length - 1):
            if words[j] == "john" and rng.random() < 0.5:
                words[j + 1] = "york"
        out.append(TaggingExample(f"s{i}", words, [WORDS[w] for w in words]))
    return TaggingDataset("<test>", "conll", "iob2", out)


def test_duplicate_input_and_copy_slots_map_back_to_the_words(wordpiece):
    prefix, suffix = special_tokens(wordpiece)
    sep = separator_id(wordpiece)
    assert wordpiece.convert_ids_to_tokens([*prefix, sep, *suffix]) == ["[CLS]", "[SEP]", "[SEP]"]
    body = np.array(wordpiece(["new", "york", "city"], is_split_into_words=True, add_special_tokens=False)["input_ids"])
    firsts = np.arange(3)
    for k in (1, 2, 5):
        ids = D.duplicate_input(prefix, body, sep, suffix, k)
        assert len(ids) == len(prefix) + k * 3 + (k - 1) + len(suffix)
        toks = wordpiece.convert_ids_to_tokens(ids.tolist())
        assert " ".join(toks) == "[CLS] " + " [SEP] ".join(["new york city"] * k) + " [SEP]"  # the paper's layout
        slots = D.copy_slots(len(prefix), 3, firsts, k)
        for alpha in range(k):
            assert [toks[j] for j in slots[alpha]] == ["new", "york", "city"]
        # shift mode puts copy α's words at the position ids they have in the k-copy input
        for alpha in range(1, k + 1):
            assert (np.arange(len(prefix), len(prefix) + 3) + D.copy_shift(alpha, 3)).tolist() == \
                slots[alpha - 1].tolist()


def test_separators_are_the_tokenizers_own():
    roberta = tagging_tokenizer(str(RESOURCES / "tiny_bpe_roberta"))
    gpt2 = tagging_tokenizer(str(RESOURCES / "tiny_bpe_gpt2"))
    assert roberta.convert_ids_to_tokens(separator_id(roberta)) == roberta.sep_token
    assert separator_id(gpt2) == gpt2.eos_token_id and special_tokens(gpt2) == ([], [])


def test_oracle_without_bias_scores_100_at_every_copy(wordpiece):
    """A position-blind oracle is right everywhere: every (k, α) cell scores 100, in both modes.
    An off-by-one in the copy bookkeeping would read the wrong tokens and fail this."""
    res = D.position_eval(PositionOracle(wordpiece), wordpiece, sentences(), k_max=6, quantiles=None, progress=False)
    for mode in D.MODES:
        assert {round(c["f1"], 6) for c in res[mode]["cells"]} == {100.0}
        assert {round(c["consistency"], 6) for c in res[mode]["cells"]} == {100.0}
    assert len(res["duplicate"]["cells"]) == 6 * 7 // 2 and len(res["shift"]["cells"]) == 6


def test_a_wrong_copy_bookkeeping_fails(wordpiece, monkeypatch):
    monkeypatch.setattr(D, "copy_slots", lambda P, L, f, k: P + np.arange(k)[:, None] * L + np.asarray(f)[None, :])
    res = D.position_eval(PositionOracle(wordpiece), wordpiece, sentences(), k_max=3, quantiles=None,
                          modes=("duplicate",), progress=False)
    assert min(c["f1"] for c in res["duplicate"]["cells"] if c["alpha"] > 1) < 90


def test_position_bias_shows_at_the_copies_past_the_cutoff(wordpiece):
    """5-word sentences: copy α occupies positions 1 + 6(α-1) .. 5 + 6(α-1); with a cutoff at 13
    copies 1 and 2 are scored 100 and later copies 0, for every k, and shift mode agrees exactly."""
    res = D.position_eval(PositionOracle(wordpiece, cutoff=13), wordpiece, sentences(length=5), k_max=5,
                          quantiles=None, progress=False)
    for mode in D.MODES:
        for c in res[mode]["cells"]:
            assert c["f1"] == (100.0 if c["alpha"] <= 2 else 0.0), (mode, c["k"], c["alpha"])
    by_alpha = {r["alpha"]: r for r in res["duplicate"]["by_alpha"]}
    assert by_alpha[1]["n_k"] == 5 and by_alpha[5]["n_k"] == 1
    assert by_alpha[3]["f1_mean"] == 0.0 and by_alpha[2]["consistency_mean"] == 100.0
    assert by_alpha[3]["consistency_mean"] == 0.0
    s = res["summary"]
    assert s["f1"] == 100.0 and s["f1_alpha_5"] == 0.0 and s["shift_f1_alpha_5"] == 0.0


def test_shift_zero_equals_k1_on_a_real_model(tmp_path):
    """Shift mode at α = 1 (shift 0) gives exactly the k = 1 predictions of a trained tiny BERT."""
    posbias.train("tiny_tagging", [f"train.output_dir={tmp_path / 'run'}", "train.max_steps=6",
                                   "data.train_file=demo:ewt-train", "data.eval_file=null"], progress=False)
    from posbias.checkpoint import load_checkpoint
    from posbias.tagging.inputs import read_for

    net, tok, cfg = load_checkpoint(tmp_path / "run" / "best")
    ds = read_for("demo:ewt-dev", cfg)
    res = D.position_eval(net, tok, ds, k_max=3, progress=False)
    dup1 = next(c for c in res["duplicate"]["cells"] if c["k"] == 1)
    sh1 = next(c for c in res["shift"]["cells"] if c["alpha"] == 1)
    assert dup1["accuracy"] == sh1["accuracy"] and dup1["per_class"] == sh1["per_class"]


def test_subset_is_fixed_across_k_and_left_out_is_counted(wordpiece):
    """Sentences of 3..12 words; max_len 40 fits k_max = 4 copies of at most 8 words (4 * 8 + 3 + 2
    = 37 <= 40 < 4 * 9 + 5): every cell scores the same 6 sentences, the other 4 are left out."""
    ds = sentences(n=0)
    ds.examples = [TaggingExample(f"s{n}", ["the"] * (n - 1) + ["london"], ["O"] * (n - 1) + ["B-LOC"])
                   for n in range(3, 13)]
    oracle = PositionOracle(wordpiece)
    res = D.position_eval(oracle, wordpiece, ds, k_max=4, quantiles=None, max_len=40, progress=False)
    sub = res["subset"]
    assert (sub["evaluated_sentences"], sub["left_out"]) == (6, 4) and sub["left_out_share"] == pytest.approx(0.4)
    assert {c["sentences"] for m in D.MODES for c in res[m]["cells"]} == {6}
    assert max(oracle.seen_lengths) <= 40


def test_length_subset_quantiles():
    ex = [TaggingExample(str(n), ["w"] * n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 100)]
    keep, info = D.length_subset(ex, (0.25, 0.75))
    assert info["length_bounds"] == [3.25, 7.75] and [len(e) for e in keep] == [4, 5, 6, 7]
    keep, info = D.length_subset(ex, None)
    assert len(keep) == 10 and info["length_bounds"] is None


def test_consistency_by_hand():
    gold = [["B-PER", "O", "B-LOC"], ["B-ORG", "O", "O"]]
    ents = posbias.tagging.metrics.entities(gold, "iob2")
    copy1 = [["B-PER", "O", "B-LOC"], ["O", "O", "O"]]  # 2 entities right
    copy2 = [["B-PER", "O", "O"], ["B-ORG", "O", "O"]]  # of those, only PER still right
    _, right1, _ = D._scores(gold, ents, copy1, "iob2")
    res, _, counts = D._scores(gold, ents, copy2, "iob2", first_right=right1)
    assert res["consistency"] == 50.0 and res["f1"] == pytest.approx(80.0)  # P 2/2, R 2/3
    # per sentence (2 TP, predicted + gold) etc.: their sums give the corpus scores back
    assert counts["f1"].tolist() == [[2, 3], [2, 2]] and counts["precision"].tolist() == [[1, 1], [1, 1]]
    assert counts["recall"].tolist() == [[1, 2], [1, 1]]
    f1, p, r = (100 * counts[k][:, 0].sum() / counts[k][:, 1].sum() for k in ("f1", "precision", "recall"))
    assert (f1, p, r) == (pytest.approx(res["f1"]), pytest.approx(res["precision"]), pytest.approx(res["recall"]))


def test_bad_options_are_one_line_errors(wordpiece):
    from posbias.errors import ConfigError

    with pytest.raises(ConfigError, match="modes"):
        D.position_eval(PositionOracle(wordpiece), wordpiece, sentences(), modes=("twice",))
    with pytest.raises(ConfigError, match="none of the"):
        D.position_eval(PositionOracle(wordpiece), wordpiece, sentences(), k_max=10, max_len=20, quantiles=None)


def test_diagnose_tagging_on_posbias_and_hugging_face_checkpoints(tmp_path):
    posbias.train("tiny_tagging", [f"train.output_dir={tmp_path / 'run'}", "train.max_steps=4"], progress=False)
    best = tmp_path / "run" / "best"
    res = posbias.diagnose(best, "demo:wnut-dev", tmp_path / "diag", k_max=4, progress=False)
    for name in ("diagnosis.md", "diagnosis.html", "diagnosis.json", "position_curves.png", "per_class.png",
                 "length_density.png", "config.yaml", "run_info.json"):
        assert (tmp_path / "diag" / name).is_file(), name
    md = (tmp_path / "diag" / "diagnosis.md").read_text(encoding="utf-8")
    assert "F1(α)" in md and "D*: sentence lengths in" in md
    assert res["subset"]["k_max"] == 4 and "f1_alpha_1" in res["summary"]
    # D* pools the run's train and dev lengths (data.length_pool: pooled, the authors' rule).
    assert res["subset"]["pool"] == [str(resolve_path(f"demo:wnut-{s}")) for s in ("train", "dev")]
    assert "pooled from" in md
    # A model trained outside posbias: its exported AutoModelForTokenClassification folder. It knows
    # no training files: the same pool is named for the same D*.
    posbias.export(best, tmp_path / "hf")
    out = cli_here("diagnose", "tagging", "--model", str(tmp_path / "hf"), "--data", "demo:wnut-dev",
                   "--output-dir", str(tmp_path / "diag_hf"), "--k-max", "3",
                   "data.length_pool_files=[demo:wnut-train,demo:wnut-dev]", "--modes", "duplicate")
    assert out.returncode == 0, out.stderr
    hf = __import__("json").loads((tmp_path / "diag_hf" / "diagnosis.json").read_text(encoding="utf-8"))
    ours = __import__("json").loads((tmp_path / "diag" / "diagnosis.json").read_text(encoding="utf-8"))
    first = lambda r: next(c for c in r["duplicate"]["cells"] if c["k"] == 1)  # noqa: E731
    assert first(hf)["f1"] == pytest.approx(first(ours)["f1"], abs=1e-9) and "shift" not in hf


def test_diagnose_tagging_bounds_dstar_by_the_quantiles_the_model_trained_on(tmp_path):
    """No --quantiles: the model's own data.length_quantiles (the authors' presets train on
    0.15-0.75; before, every diagnosis took Q1-Q3); an explicit pair wins; a folder that knows none
    (a Hugging Face export) gets Q1-Q3."""
    posbias.train("tiny_tagging", [f"train.output_dir={tmp_path / 'run'}", "train.max_steps=2",
                                   "data.length_quantiles=[0.15,0.75]"], progress=False)
    best = tmp_path / "run" / "best"
    posbias.export(best, tmp_path / "hf")

    def used(model, name, *flags):
        out = cli_here("diagnose", "tagging", "--model", str(model), "--data", "demo:wnut-dev", "--output-dir",
                       str(tmp_path / name), "--k-max", "2", "--modes", "duplicate", "--bootstrap-samples", "0", *flags)
        assert out.returncode == 0, out.stderr
        return __import__("json").loads((tmp_path / name / "diagnosis.json").read_text(encoding="utf-8"))["subset"]["quantiles"]

    assert used(best, "own") == [0.15, 0.75]
    assert used(best, "flag", "--quantiles", "0.25", "0.75") == [0.25, 0.75]
    assert used(tmp_path / "hf", "diag_hf") == [0.25, 0.75]
    with pytest.raises(ConfigError, match="quantiles"):
        posbias.diagnose(best, "demo:wnut-dev", tmp_path / "bad", quantiles="q1q3", progress=False)


def _verdict(model, wordpiece, n, k_max=5, **kw):
    from posbias.tagging.diagnose import position_verdict

    res = D.position_eval(model, wordpiece, sentences(n=n, length=5), k_max=k_max, quantiles=None, progress=False,
                          keep_counts=True)
    counts = D.sentence_counts(res)
    res["summary"] = D.summary(res)
    return res, counts, position_verdict(res, counts, samples=300, **kw)


def test_the_verdict_finds_a_planted_position_bias_with_its_sign(wordpiece):
    res, counts, bias = _verdict(PositionOracle(wordpiece, cutoff=13), wordpiece, n=40)
    assert all(D.SENTENCE_COUNTS not in res[m] for m in D.MODES)  # taken out: the result stays JSON
    cells, arrays = counts["duplicate"]
    assert arrays["f1"].shape == (len(cells), 40, 2) and set(arrays) == {"f1", "precision", "recall"}
    for mode in D.MODES:
        v = bias["axes"][mode]
        curve = [r["f1_mean"] for r in res[mode]["by_alpha"]]
        assert v["curve"] == pytest.approx(curve, rel=1e-12)  # the counts give the report's own F1(α) back
        assert v["effect"] == pytest.approx(100.0) and v["ci"] == pytest.approx([100.0, 100.0])
        assert v["evidence"] == "yes" and v["trend"]["slope"] < 0
    assert bias["evidence"] == "yes" and bias["sentence"].startswith(
        "Copy 5 scores 100.0 F1 lower than copy 1 (40 sentences, duplicate mode)")
    assert not bias["quality"]["below"]


def test_the_verdict_of_a_position_blind_tagger_is_no(wordpiece):
    _, _, bias = _verdict(PositionOracle(wordpiece), wordpiece, n=40)
    for v in bias["axes"].values():
        assert v["effect"] == 0 and v["evidence"] == "no"
    assert bias["sentence"].endswith("evidence of position bias: no.")


def test_the_verdict_needs_enough_sentences(wordpiece):
    _, _, bias = _verdict(PositionOracle(wordpiece, cutoff=13), wordpiece, n=12)
    assert bias["evidence"] == "too few" and "fewer than 30 sentences" in bias["sentence"]
    _, _, bias = _verdict(PositionOracle(wordpiece, cutoff=13), wordpiece, n=12, min_size=10)
    assert bias["evidence"] == "yes"


def test_copy_scores_round_trip_with_f1_rebuilt_and_spans_placed(tmp_path):
    from posbias.tagging.duplicated import copy_position_span, load_copy_scores, save_copy_scores

    rng = np.random.default_rng(0)
    tp = rng.integers(0, 3, (3, 5))
    n_pred, n_gold = tp + rng.integers(0, 2, (3, 5)), tp + rng.integers(0, 2, (3, 5))
    counts = {"duplicate": ([(1, 1), (2, 1), (2, 2)],
                            {"f1": np.stack([2 * tp, n_pred + n_gold], -1), "precision": np.stack([tp, n_pred], -1),
                             "recall": np.stack([tp, n_gold], -1)})}
    save_copy_scores(tmp_path / "c.npz", counts, {"body_tokens": np.array([4, 6, 2, 3, 5]), "prefix": 1,
                                                  "position_base": 2})
    back = load_copy_scores((tmp_path / "c.npz").read_bytes(), "c.npz")
    assert back["prefix"] == 1 and back["position_base"] == 2
    assert np.array_equal(back["modes"]["duplicate"]["f1"], counts["duplicate"][1]["f1"])
    assert back["modes"]["duplicate"]["cells"].tolist() == [[1, 1], [2, 1], [2, 2]]
    # copy 2 of a 4-token sentence after [CLS]: slots 1..4 hold copy 1, 5 the separator, 6..9 copy 2 (+ base 2)
    assert copy_position_span(2, np.array([4]), prefix=1, position_base=2).tolist() == [[8, 11]]
    with pytest.raises(ConfigError, match="c.npz: the per-copy scores are damaged"):
        load_copy_scores(b"not an archive", "c.npz")


def test_a_pickled_object_in_copy_scores_is_refused(tmp_path):
    import io

    from posbias.tagging.duplicated import load_copy_scores

    buf = io.BytesIO()
    np.savez(buf, evil=np.array([object()], dtype=object))
    with pytest.raises(ConfigError, match="damaged"):
        load_copy_scores(buf.getvalue(), "evil.npz")


def test_a_copy_on_trained_ids_is_one_whose_every_id_got_a_gradient():
    from posbias.tagging.copies import on_trained, trained_mask

    curves = [{"run": "r", "kind": "position_updates", "step": i, "value": v}
              for i, v in enumerate([0.5, 0.1, 0.0, 0.2, 0.3, 0.0])]
    mask = trained_mask(curves, "r")
    assert mask.tolist() == [True, True, False, True, True, False] and trained_mask(curves, "other") is None
    spans = np.array([[0, 1], [1, 2], [3, 4], [4, 5], [4, 9]])
    assert on_trained(spans, mask).tolist() == [True, False, True, False, False]
