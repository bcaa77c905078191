"""The tagging diagnosis report as a reader sees it: its title names model and data (a bundled set by
its alias), the warning stands above the tables, the α curves at most two panels a row."""
from PIL import Image

import posbias
from posbias.config import RESOURCES, build_config


def test_the_tagging_report_names_model_and_data_and_lays_out_its_plots(tmp_path):
    cfg = build_config({"task": "tagging",
                        "model": {"name_or_path": None, "tokenizer": "tiny",
                                  "encoder": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
                                              "num_attention_heads": 4, "intermediate_size": 64}},
                        "data": {"train_file": "demo:wnut-train", "eval_file": "demo:wnut-dev", "max_seq_len": 64,
                                 "stride": 16, "max_train_examples": 16, "max_eval_examples": 8},
                        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 1, "batch_size": 8,
                                  "eval_batch_size": 8, "device": "cpu"}})
    posbias.train(cfg, progress=False)
    model = tmp_path / "run" / "best"
    res = posbias.diagnose(model, "demo:wnut-dev", tmp_path / "diag", k_max=3, bootstrap_samples=0, progress=False)
    assert res["position_bias"]["quality"]["below"]  # one step: F1 under the floor
    md = (tmp_path / "diag" / "diagnosis.md").read_text(encoding="utf-8")
    lines = md.splitlines()
    assert lines[0] == f"# Position diagnosis of {model} on demo:wnut-dev"
    assert str(RESOURCES) not in md and "Data: demo:wnut-dev (" in md and "pooled from demo:wnut-train; demo:wnut-dev" in md
    warning = next(i for i, x in enumerate(lines) if x.startswith("> **Warning:** overall F1"))
    assert warning < next(i for i, x in enumerate(lines) if x.startswith("| axis |"))
    page = (tmp_path / "diag" / "diagnosis.html").read_text(encoding="utf-8")
    assert page.index("<blockquote class='warning'>") < page.index("<table")
    # five α panels (F1, Prec, Rec, sub-token F1, consistency) in rows of two: 3 rows, each panel legible
    width, height = Image.open(tmp_path / "diag" / "position_curves.png").size
    assert width <= 1200 and height > width  # not one row of five (3.4 in each, 1,870 px wide before)
