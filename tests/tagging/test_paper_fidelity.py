"""The token-positional-bias paper's settings (issue 29, items 7-9; issue 47, item 3): D* bounds from
train + dev + test pooled (and the presets that default to the authors' bounds), the authors' "F1"
over sub-tokens (POS and NER, seqeval's lenient mode) beside the strict metrics, IOBES labels scored
in the file's IOB2, consistency at α = 1 computed, no std for a single value, untyped entity tags
refused."""
import json
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posbias.analysis.stats import mean_std
from posbias.config import PRESETS, RESOURCES, build_config, load_config
from posbias.errors import ConfigError, DataError
from posbias.experiment.aggregation import metric_value, report_metrics
from posbias.tagging import diagnose as G
from posbias.tagging import duplicated as D
from posbias.tagging import metrics as M
from posbias.tagging.evaluate import evaluate_dataset
from posbias.tagging.examples import TaggingDataset, TaggingExample
from posbias.tagging.readers import read_tagging
from posbias.tagging.inputs import length_pool, read_for, tagging_tokenizer

from helpers import SHARED_DATA, TINY_ENCODER


@pytest.fixture(scope="module")
def wordpiece():
    return tagging_tokenizer(str(RESOURCES / "tiny_tokenizer"))


def conll(path, lengths):
    """A CoNLL file of all-O sentences of these word lengths."""
    path.write_text("\n\n".join("\n".join(f"w{i} O" for i in range(n)) for n in lengths) + "\n", encoding="utf-8")
    return str(path)


MODEL = {"name_or_path": None, "tokenizer": "tiny", "encoder": dict(TINY_ENCODER)}


def tagging_cfg(**data):
    return build_config({"task": "tagging", "model": MODEL, "data": data})


# ------------------------------------------------------------------------------------ item 7: D*
def test_pooled_bounds_cut_every_split_alike(tmp_path):
    """Lengths train 1..8, dev 10 12, test 3 20; pooled (12 values) Q1 = 3, Q3 = 8.5 (linear
    interpolation, as np.percentile): every file is cut to [3, 8.5]. Split: each file its own."""
    train, dev, test = conll(tmp_path / "train.conll", range(1, 9)), conll(tmp_path / "dev.conll", [10, 12]), \
        conll(tmp_path / "test.conll", [3, 20])
    cfg = tagging_cfg(train_file=train, eval_file=dev, length_quantiles=[0.25, 0.75],
                      length_pool_files=[train, dev, test])
    assert cfg.data.length_pool == "pooled"  # the default
    pooled = {name: read_for(f, cfg) for name, f in (("train", train), ("dev", dev), ("test", test))}
    assert {d.length_subset["length_bounds"][0] for d in pooled.values()} == {3.0}
    assert {d.length_subset["length_bounds"][1] for d in pooled.values()} == {8.5}
    assert [len(e) for e in pooled["train"].examples] == [3, 4, 5, 6, 7, 8]
    assert pooled["dev"].examples == [] and [len(e) for e in pooled["test"].examples] == [3]
    info = pooled["test"].length_subset
    assert info["pool"] == [train, dev, test] and info["pool_sentences"] == 12 and info["split_sentences"] == 2
    # Split (the old rule): train's own Q1, Q3 of 1..8 are 2.75 and 6.25.
    split = read_for(train, tagging_cfg(train_file=train, length_quantiles=[0.25, 0.75], length_pool="split"))
    assert split.length_subset["length_bounds"] == [2.75, 6.25] and split.length_subset["pool"] is None
    assert [len(e) for e in split.examples] == [3, 4, 5, 6]
    # No pool files named: the run's train and eval files (1..8, 10, 12: Q1 3.25, Q3 7.75).
    default = read_for(test, tagging_cfg(train_file=train, eval_file=dev, length_quantiles=[0.25, 0.75]))
    assert default.length_subset["length_bounds"] == [3.25, 7.75] and default.length_subset["pool"] == [train, dev]


def test_length_pool_config_keys(tmp_path):
    with pytest.raises(ConfigError, match="data.length_pool"):
        tagging_cfg(length_pool="both")
    with pytest.raises(ConfigError, match="data.length_pool_files"):
        tagging_cfg(length_pool_files=[])
    with pytest.raises(ConfigError, match="data.length_pool_files.*cannot be read"):
        length_pool(tagging_cfg(length_pool_files=[str(tmp_path / "missing.conll")]))
    assert length_pool(tagging_cfg(length_pool="split", train_file="demo:wnut-train")) is None
    assert length_pool(tagging_cfg()) is None  # nothing to pool: each file uses its own lengths
    # A config saved before the key existed cut each file alone, and keeps that and its hash.
    saved = {"task": "tagging", "model": MODEL, "data": {"length_quantiles": [0.25, 0.75]}}
    old = build_config(saved, saved=True)
    assert old.data.length_pool == "split"
    explicit = {**saved, "data": {**saved["data"], "length_pool": "split"}}
    assert old.hash() == build_config(explicit, saved=True).hash()
    assert build_config(saved).data.length_pool == "pooled"  # a new config: the authors' rule


@pytest.mark.skipif(not (SHARED_DATA / "conll2003" / "test.txt").is_file(), reason="shared CoNLL-2003 absent")
def test_the_authors_rule_gives_their_conll_counts():
    """trim_dataset: 15th-75th percentile of train + dev + test pooled = 4..22 words, 8,666 training
    and 2,257 test sentences; the paper's Q1-Q3 of the split alone gives train 6..22, test 5..20."""
    files = [str(SHARED_DATA / "conll2003" / f) for f in ("train.txt.gz", "valid.txt", "test.txt")]
    authors = tagging_cfg(length_quantiles=[0.15, 0.75], length_pool_files=files)
    train, test = read_for(files[0], authors), read_for(files[2], authors)
    assert train.length_subset["length_bounds"] == [4.0, 22.0] == test.length_subset["length_bounds"]
    assert (len(train.examples), len(test.examples)) == (8666, 2257)
    split = tagging_cfg(length_quantiles=[0.25, 0.75], length_pool="split")
    assert read_for(files[0], split).length_subset["length_bounds"] == [6.0, 22.0]
    assert read_for(files[2], split).length_subset["length_bounds"] == [5.0, 20.0]


@pytest.mark.skipif(not (SHARED_DATA / "conll2003" / "test.txt").is_file()
                    or not (SHARED_DATA / "ud_english_ewt" / "en_ewt-ud-test.conllu.gz").is_file(),
                    reason="shared CoNLL-2003 / UD English EWT absent")
@pytest.mark.parametrize("preset, bounds, counts", [
    ("conll2003_dstar_minilm", [4.0, 22.0], (8666, 1967, 2257)),
    ("ud_ewt_pos_dstar_minilm", [4.0, 21.0], (7457, 1289, 1302))])
def test_the_authors_presets_cut_dstar_as_they_did(preset, bounds, counts):
    """The position-bias presets default to the authors' D*: the 15th-75th percentile of train + dev +
    test pooled, one pair of bounds for every split, and their sub-token labels."""
    cfg = load_config(PRESETS / f"{preset}.yaml")
    d = cfg.data
    assert (d.length_quantiles, d.length_pool, d.label_subtokens) == ([0.15, 0.75], "pooled", "copy")
    assert d.length_pool_files[:2] == [d.train_file, d.eval_file] and len(d.length_pool_files) == 3
    cut = [read_for(f, cfg) for f in d.length_pool_files]
    assert [x.length_subset["length_bounds"] for x in cut] == [bounds] * 3
    assert tuple(len(x.examples) for x in cut) == counts
    assert {x.length_subset["pool_sentences"] for x in cut} == {sum(x.length_subset["split_sentences"] for x in cut)}
    assert cut[0].scheme == ("bioes" if "conll" in preset else "none")


# ------------------------------------------------------------------------------ item 8: POS "F1"
def test_seqeval_subtoken_f1_is_the_authors_computation():
    """Their `Nereval._compute_overall`: seqeval classification_report, default mode, micro avg, on
    `S-<UPOS>` labels ("_" -> O). Each S- label is its own chunk: F1 is a micro F1 over sub-tokens."""
    from seqeval.metrics import classification_report

    gold = [["NOUN", "NOUN", "VERB", "_"], ["DET", "NOUN"]]
    pred = [["NOUN", "VERB", "VERB", "_"], ["DET", "ADJ"]]
    ours = M.seqeval_subtoken_f1(gold, pred)
    wrap = lambda seqs: [["O" if t == "_" else f"S-{t}" for t in s] for s in seqs]  # noqa: E731
    theirs = classification_report(wrap(gold), wrap(pred), output_dict=True, zero_division=0)["micro avg"]["f1-score"]
    assert ours == pytest.approx(100 * theirs) == pytest.approx(100 * 3 / 5)  # 3 of 5 tagged right
    rng = np.random.default_rng(0)  # the closed form against seqeval on random sequences, "_" included
    tags = ["NOUN", "VERB", "DET", "_", "B-X"]
    for _ in range(20):
        g = [[tags[i] for i in rng.integers(0, 5, n)] for n in rng.integers(1, 9, 6)]
        p = [[tags[i] for i in rng.integers(0, 5, len(s))] for s in g]
        ref = classification_report(wrap(g), wrap(p), output_dict=True, zero_division=0)["micro avg"]["f1-score"]
        assert M.seqeval_subtoken_f1(g, p) == pytest.approx(100 * ref, abs=1e-9)
    # Bare tags would be read differently (runs merged into chunks): the wrapping matters.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval: "NOUN seems not to be NE tag"
        bare = classification_report(gold, pred, output_dict=True)["micro avg"]["f1-score"]
    assert 100 * bare != pytest.approx(ours)
    assert M.subtoken_sequences([["DET", "NOUN"]], [np.array([1, 3])]) == [["DET", "NOUN", "NOUN", "NOUN"]]


class TokenOracle(torch.nn.Module):
    """A tagger that reads each token's label off its id (`table`), position-blind: a word's first
    sub-token carries its tag, continuation pieces (absent from the table) label 0."""

    def __init__(self, tokenizer, table: dict, labels: list, scheme: str):
        super().__init__()
        ids = torch.zeros(len(tokenizer), dtype=torch.long)
        for token, label in table.items():
            ids[tokenizer.convert_tokens_to_ids(token)] = labels.index(label)
        self.register_buffer("table", ids)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # evaluate reads the device off a parameter
        self.labels, self.scheme = labels, scheme
        self.encoder = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512, model_type="bert"))
        self._inputs = SimpleNamespace(positions=True)
        self.position_base = self.position_pad = 0

    def forward(self, batch):
        label = self.table[batch["input_ids"]]
        return {"logits": torch.nn.functional.one_hot(label, len(self.labels)).float()}


POS_LABELS = ["ADJ", "DET", "NOUN", "VERB"]  # ADJ (0) is what continuation pieces get
POS_TABLE = {"the": "DET", "z": "NOUN", "wal": "VERB", "quickly": "ADJ"}  # zebra = z ##e ##b ##ra, walked = wal ##k ##ed


def pos_data(n=4):
    words, tags = ["the", "zebra", "walked", "quickly"], ["DET", "NOUN", "VERB", "ADJ"]
    return TaggingDataset("<pos>", "conll", "none", [TaggingExample(f"s{i}", words, tags) for i in range(n)])


@pytest.mark.parametrize("label_subtokens, expected", [("first", 100.0), ("all", 100 * 4 / 9)])
def test_evaluate_reports_the_subtoken_f1_beside_accuracy(wordpiece, label_subtokens, expected):
    """Every word is right at its first sub-token (accuracy 100). The authors' F1 counts the 9
    sub-tokens: a model trained on first sub-tokens has its word's prediction there (100); one trained
    on all of them (their setting) is read at each, and the 5 continuation pieces are wrong: 4/9."""
    cfg = tagging_cfg(label_subtokens=label_subtokens)
    oracle = TokenOracle(wordpiece, POS_TABLE, POS_LABELS, "none")
    res = evaluate_dataset(oracle, wordpiece, cfg, pos_data(), progress=False)
    assert res["accuracy"] == 100.0 and res["subtokens"] == 4 * 9
    assert res[M.SUBTOKEN_F1] == pytest.approx(expected)
    assert res["subtoken_predictions"] == ("own" if label_subtokens == "all" else "word")


def test_position_eval_reports_the_subtoken_f1_at_every_alpha(wordpiece):
    oracle = TokenOracle(wordpiece, POS_TABLE, POS_LABELS, "none")
    for own, expected in ((False, 100.0), (True, 100 * 4 / 9)):
        res = D.position_eval(oracle, wordpiece, pos_data(), k_max=3, quantiles=None, progress=False,
                              own_subtokens=own)
        for mode in D.MODES:
            assert {round(c[M.SUBTOKEN_F1], 9) for c in res[mode]["cells"]} == {round(expected, 9)}
            assert {c["accuracy"] for c in res[mode]["cells"]} == {100.0}
        rows = D.experiment_metrics(res, alphas=(2, 3))
        assert rows[M.SUBTOKEN_F1] == pytest.approx(expected) == rows[f"{M.SUBTOKEN_F1}_alpha_3"]
        assert ["sub-token F1(3)", f"{M.SUBTOKEN_F1}_alpha_3"] in rows["report"]
        assert rows[f"{M.SUBTOKEN_F1}_alpha_3_std"] is None  # α = k_max: one k


# ---------------------------------------------------- the authors' NER metric beside the strict F1
NER_LABELS = ["O", "S-LOC", "S-PER"]  # a BIOES model; O (0) is what continuation pieces get
NER_TABLE = {"z": "S-PER", "london": "S-LOC"}  # zebra = z ##e ##b ##ra, walked = wal ##k ##ed


def ner_data(n=3):
    """An IOB2 file: every word right at its first piece for the oracle above."""
    words, tags = ["the", "zebra", "walked", "london"], ["O", "B-PER", "O", "B-LOC"]
    return TaggingDataset("<ner>", "conll", "iob2", [TaggingExample(f"s{i}", words, tags) for i in range(n)],
                          source_scheme="iob2")


# Their gold: the BIOES labels copied, O | S-PER x4 | O x3 | S-LOC = 5 chunks per sentence. A model
# that learned `copy` is read at every piece: S-PER O O O | O O O | S-LOC = 2 chunks, both right:
# F1 = 2 * 2 / (5 + 2). Otherwise each word's prediction is copied: all 5 right.
OWN_NER_F1 = 100 * 4 / 7


@pytest.mark.parametrize("label_subtokens, read, expected", [
    ("first", "word", 100.0), ("all", "word", 100.0), ("copy", "own", OWN_NER_F1)])
def test_evaluate_reports_the_authors_ner_f1_beside_the_strict_f1(wordpiece, label_subtokens, read, expected):
    """`all` trained the continuation pieces on I-X, not on the copied labels their metric scores:
    its words' predictions are copied instead, as for `first`."""
    cfg = tagging_cfg(label_subtokens=label_subtokens)
    oracle = TokenOracle(wordpiece, NER_TABLE, NER_LABELS, "bioes")
    res = evaluate_dataset(oracle, wordpiece, cfg, ner_data(), progress=False)
    assert res["f1"] == 100.0 and res["scheme"] == "iob2"  # strict, over words, in the file's scheme
    assert res[M.SUBTOKEN_F1] == pytest.approx(expected)
    assert res["subtoken_predictions"] == read and res["subtoken_scheme"] == "bioes" and res["subtokens"] == 3 * 9
    assert report_metrics(res) == (["F1", "precision", "recall", "sub-token F1"], "F1")
    assert metric_value(res, "sub-token F1") == res[M.SUBTOKEN_F1]


def test_position_eval_and_its_diagnosis_show_the_authors_ner_f1(wordpiece, tmp_path):
    oracle = TokenOracle(wordpiece, NER_TABLE, NER_LABELS, "bioes")
    for own, expected in ((False, 100.0), (True, OWN_NER_F1)):
        res = D.position_eval(oracle, wordpiece, ner_data(), k_max=3, quantiles=None, progress=False,
                              own_subtokens=own, keep_counts=True)
        assert res["subtoken_predictions"] == ("own" if own else "word") and res["subtoken_scheme"] == "bioes"
        for mode in D.MODES:
            assert {round(c[M.SUBTOKEN_F1], 9) for c in res[mode]["cells"]} == {round(expected, 9)}
            assert {c["f1"] for c in res[mode]["cells"]} == {100.0}
        rows = D.experiment_metrics(res, alphas=(2, 3))
        assert rows[M.SUBTOKEN_F1] == pytest.approx(expected) == rows[f"{M.SUBTOKEN_F1}_alpha_3"]
        assert ["sub-token F1(3)", f"{M.SUBTOKEN_F1}_alpha_3"] in rows["report"]
        assert ["F1(3)", "f1_alpha_3"] in rows["report"]
    head, body = G._alpha_table(res)
    col = head.index("sub-token F1(α)")
    assert head[2:col] == ["F1(α)", "Prec(α)", "Rec(α)"]
    assert [row[col] for row in body] == ["57.14 ± 0.00", "57.14 ± 0.00", "57.14"]
    G.write_report(res, tmp_path, "oracle", samples=50)
    md = (tmp_path / "diagnosis.md").read_text(encoding="utf-8")
    assert "sub-token F1(α)" in md and "paper's NER \"F1\"" in md and "(BIOES)" in md
    assert "each sub-token's own prediction" in md


def test_a_run_trained_with_copy_evaluates_and_predicts(tmp_path):
    """train (BIOES labels copied to every piece) -> its evaluation reads each piece's own prediction
    for the sub-token F1 -> evaluate and predict from the checkpoint read words at their first piece."""
    import posbias

    out = tmp_path / "run"
    posbias.train(PRESETS / "tiny_tagging.yaml", [f"train.output_dir={out}", "train.max_steps=2", "train.device=cpu",
                                                  "data.label_subtokens=copy", "data.max_eval_examples=20"],
                  progress=False)
    scored = json.loads((out / "eval" / "metrics.json").read_text(encoding="utf-8"))
    assert scored["subtoken_predictions"] == "own" and scored["subtoken_scheme"] == "bioes"
    assert 0 <= scored[M.SUBTOKEN_F1] <= 100 and scored["subtokens"] > scored["words"]
    again = posbias.evaluate(out / "best", "demo:wnut-dev", overrides=["data.max_eval_examples=20"], progress=False)
    assert again[M.SUBTOKEN_F1] == pytest.approx(scored[M.SUBTOKEN_F1]) and again["f1"] == pytest.approx(scored["f1"])
    tagged = posbias.predict(out / "best", text="Angela Merkel visited Paris .")
    assert len(tagged["text"]["tags"]) == len(tagged["text"]["words"]) == 5


# ------------------------------------------------------------------------------ item 8: IOBES
def test_bioes_predictions_are_scored_in_the_files_iob2():
    """`B-PER O` is no entity in strict BIOES (a B- must end with E-) but is one in IOB2: a BIOES
    model is scored on an IOB2 file exactly as an IOB2 model predicting the same entities."""
    gold = [["B-PER", "O", "B-LOC", "I-LOC"]]
    bioes_pred = [["B-PER", "O", "B-LOC", "E-LOC"]]
    g, p, scheme = M.in_scoring_scheme(gold, bioes_pred, "iob2", "bioes")
    assert scheme == "iob2" and p == [["B-PER", "O", "B-LOC", "I-LOC"]] and g == gold
    assert M.score(g, p, scheme)["f1"] == 100.0
    # Strict BIOES (the old scoring of such a model) drops the B- PER: P 1/1, R 1/2.
    assert M.score([["S-PER", "O", "B-LOC", "E-LOC"]], bioes_pred, "bioes")["f1"] == pytest.approx(200 / 3)
    assert M.scoring_schemes("bioes", "bioes") == "bioes" and M.scoring_schemes("bioes", "iob2") == "iob2"


def test_a_bioes_model_keeps_the_scores_of_an_iob2_one(wordpiece, tmp_path):
    """The same token oracle under BIOES labels (its single-word entity predicted B-, not S-) and
    IOB2 labels: identical F1 on an IOB2 file, in evaluate and in F1(α), and IOB2 predictions."""
    words, tags = ["the", "john", "visited", "london"], ["O", "B-PER", "O", "B-LOC"]
    data = TaggingDataset("<ner>", "conll", "iob2", [TaggingExample(f"s{i}", words, tags) for i in range(3)],
                          source_scheme="iob2")
    table = {"john": "B-PER", "london": "B-LOC"}
    scores = {}
    for scheme, labels in (("iob2", ["O", "B-LOC", "B-PER"]), ("bioes", ["O", "B-LOC", "B-PER", "S-LOC", "S-PER"])):
        oracle = TokenOracle(wordpiece, table, labels, scheme)
        res = evaluate_dataset(oracle, wordpiece, tagging_cfg(), data, tmp_path / scheme, progress=False)
        pos = D.position_eval(oracle, wordpiece, data, k_max=2, quantiles=None, progress=False)
        scores[scheme] = (res["f1"], res["scheme"], pos["summary"]["f1"], pos["scheme"])
        assert "S-" not in (tmp_path / scheme / "predictions.conll").read_text(encoding="utf-8")
    assert scores["bioes"] == scores["iob2"] == (100.0, "iob2", 100.0, "iob2")


def test_label_scheme_defaults_to_iobes_for_entities_only():
    cfg = tagging_cfg(train_file="demo:wnut-train")
    assert cfg.data.label_scheme == "bioes" and tagging_cfg(label_scheme="iobes").data.label_scheme == "bioes"
    ner = read_for("demo:wnut-dev", cfg)
    assert ner.scheme == "bioes" and ner.file_scheme == "iob2"
    pos = read_for("demo:ewt-dev", cfg)  # per-word labels: left as they are, no error
    assert pos.scheme == "none" and pos.file_scheme == "none"


# ---------------------------------------------------------------------------- item 9: smaller
def test_consistency_at_alpha_1_is_computed(wordpiece):
    """Copy 1 gets nothing right (the oracle predicts no entity): consistency(1) has no share to take,
    so it is undefined (None), not 100; with everything right it is 100 by the same formula."""
    data = TaggingDataset("<ner>", "conll", "iob2", [TaggingExample("a", ["john", "visited"], ["B-PER", "O"])],
                          source_scheme="iob2")
    blind = TokenOracle(wordpiece, {}, ["O", "B-PER"], "iob2")
    res = D.position_eval(blind, wordpiece, data, k_max=2, quantiles=None, progress=False)
    assert {c["consistency"] for m in D.MODES for c in res[m]["cells"]} == {None}
    right = TokenOracle(wordpiece, {"john": "B-PER"}, ["O", "B-PER"], "iob2")
    res = D.position_eval(right, wordpiece, data, k_max=2, quantiles=None, progress=False)
    assert {c["consistency"] for c in res["duplicate"]["cells"] if c["alpha"] == 1} == {100.0}
    assert D.consistency([np.array([False])], [np.array([True])]) is None


def test_a_single_value_has_no_std(wordpiece, tmp_path):
    mean, std = mean_std([5.0])
    assert mean == 5.0 and math.isnan(std)
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    oracle = TokenOracle(wordpiece, {"john": "B-PER"}, ["O", "B-PER"], "iob2")
    data = TaggingDataset("<ner>", "conll", "iob2", [TaggingExample("a", ["john", "visited"], ["B-PER", "O"])],
                          source_scheme="iob2")
    res = D.position_eval(oracle, wordpiece, data, k_max=3, quantiles=None, progress=False)
    last = res["duplicate"]["by_alpha"][-1]
    assert last["n_k"] == 1 and last["f1_std"] is None  # α = k_max: one k
    assert res["duplicate"]["by_alpha"][0]["f1_std"] == 0.0  # three k, all 100: a real zero spread
    assert {r["f1_std"] for r in res["shift"]["by_alpha"]} == {None}  # one cell per α
    json.dumps(res, allow_nan=False)  # no NaN in the JSON result
    from posbias.tagging.diagnose import _alpha_table, _fmt

    assert _fmt(90.0, None) == "90.00" and _fmt(90.0, float("nan")) == "90.00" and _fmt(90.0, 0.0) == "90.00 ± 0.00"
    _, body = _alpha_table(res)
    assert "±" not in body[-1][2] and "±" in body[0][2]


def test_reports_show_no_plus_minus_for_one_seed(tmp_path):
    from posbias.analysis import report as R

    assert R._mean_sd(80.0, float("nan"), 1) == "80.00 (1 run)"
    assert R._bar(float("nan")) == 0.0 and R._bar(None) == 0.0 and R._bar(1.5) == 1.5
    rows = [{"dataset": None, "train_size": None, "eval_set": "test", "metric": "F1", "method": "base",
             "mean": 80.0, "std": float("nan"), "n_runs": 1, "wall_seconds": 1.0}]
    assert R.plot_comparison(rows, ["base"], tmp_path / "c.png").is_file()
    _, body = R.comparison_table(rows)
    assert "±" not in body[0][4]


def test_untyped_entity_tags_are_refused(tmp_path):
    """A file whose only entity-like tags are bare prefixes (`B-`, `I-`) was read as POS labels."""
    bad = tmp_path / "untyped.conll"
    bad.write_text("Ana B-\nBerg I-\nwent O\n\nto O\nOslo B-\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 1.*'B-' has no type.*data.scheme none"):
        read_tagging(str(bad))
    with pytest.raises(DataError, match="line 1"):
        read_tagging(str(bad), on_bad_record="skip")  # a file-level problem: never skipped sentence by sentence
    assert read_tagging(str(bad), scheme="none").examples[0].tags == ["B-", "I-", "O"]  # declared labels
    typed = tmp_path / "typed.conll"
    typed.write_text("Ana B-PER\nwent O\n\nOslo B-\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 4.*no entity type"):  # among typed tags: that sentence
        read_tagging(str(typed))
