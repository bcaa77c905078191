"""The GPU scripts, on the CPU with tiny encoders: benchmarks/gpu/throughput.py measures every row (posbias
train, HF Trainer, the bare encoder, evaluation) and writes throughput.json with positive throughput
and the Markdown table; tools/gpu/lanes.py runs a grid as concurrent processes, archives the finished runs'
store and small files, and stops what cannot finish by its deadline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posbias.config import RESOURCES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "throughput.py"
LANES = ROOT / "tools" / "gpu" / "lanes.py"
# The GPU queue's items, each beside its paper's specs (a variant of an item: NAME_full_VARIANT.yaml).
QUEUE_SPECS = sorted({*ROOT.glob("reproductions/*/*_full.yaml"), *ROOT.glob("reproductions/*/*_full_*.yaml")})
SMOKE = RESOURCES.parent / "configs" / "experiments" / "smoke.yaml"  # 2 methods x 2 seeds, 6 steps


@pytest.mark.slow
def test_throughput_script_measures_every_row_on_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--steps", "2",
                        "--precisions", "fp32", "--dev", "8", "--eval-passes", "1", "--max-seconds", "600",
                        "--tokenizer", str(RESOURCES / "tiny_tokenizer"), "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "throughput.json").read_text(encoding="utf-8"))
    rows = {x["row"]: x for x in res["rows"]}
    assert {"posbias train", "HF Trainer", "bare train (padded)", "bare train (posbias batches)", "bare forward",
            "posbias evaluate (loop)", "posbias evaluate (call)"} <= set(rows), sorted(rows)
    for name, row in rows.items():
        assert not row.get("error"), (name, row.get("error"))
        assert row["precision"] == "fp32"
        for key in ("tokens_per_s", "padded_tokens_per_s", "steps_per_s"):
            assert row[key] > 0, (name, key, row[key])
        assert row["padded_tokens_per_s"] >= row["tokens_per_s"]  # padding only adds tokens
    assert rows["posbias train"]["vs_bare"] > 0 and rows["posbias evaluate (loop)"]["ref"] == "bare forward"
    assert rows["posbias evaluate (loop)"]["same_windows_as_bare"]
    assert res["skipped"] == [] and res["hardware"]["device"] == "cpu" and res["config"]["tiny"]
    assert "| posbias train | fp32 |" in r.stdout


def _lanes(tmp_path, deadline, *groups, lanes=2):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, str(LANES), str(SMOKE), "--device", "cpu", "--lanes", str(lanes), "--poll", "1",
                        "--threads", "1", "--deadline", str(deadline), "--output-dir", str(tmp_path / "exp"),
                        "--archive", str(tmp_path / "archive"), "--runs", *groups],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads((tmp_path / "archive" / "lanes.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_lanes_run_a_seed_and_archive_its_runs(tmp_path):
    status = _lanes(tmp_path, 600, "context_softmax/seed1,all_token_softmax/seed1")
    assert {name: run["outcome"] for name, run in status["runs"].items()} == {
        "context_softmax/seed1": "finished", "all_token_softmax/seed1": "finished"}
    assert status["copy"]["returncode"] == 0 and status["not_started"] == []
    import sqlite3

    with sqlite3.connect(tmp_path / "archive" / "store" / "experiment.sqlite") as db:
        rows = db.execute("SELECT name, status FROM runs ORDER BY name").fetchall()
    assert rows == [("all_token_softmax/seed1", "finished"), ("context_softmax/seed1", "finished")]
    for run in ("context_softmax/seed1", "all_token_softmax/seed1"):
        folder = tmp_path / "archive" / "runs" / run
        assert (folder / "run_info.json").is_file() and (folder / "evals" / "test" / "metrics.json").is_file()
        assert not list(folder.rglob("*.safetensors"))  # results travel, checkpoints stay


def test_lanes_stop_what_cannot_finish_by_the_deadline(tmp_path):
    # One lane, a 2-second deadline: the first seed is still loading when it comes; the second never starts.
    status = _lanes(tmp_path, 2, "context_softmax/seed1", "context_softmax/seed2", lanes=1)
    assert status["runs"]["context_softmax/seed1"]["outcome"] == "stopped at the deadline"
    assert status["not_started"] == ["context_softmax/seed2"]


@pytest.mark.parametrize("spec", QUEUE_SPECS, ids=lambda p: p.stem)
def test_every_gpu_queue_spec_builds_its_grid(spec, tmp_path):
    """The queue items' specs load as `experiment run` reads them (no data needed to build the grid):
    five seeds each, and map_full's forward-only scoring of every MaP_E run is a decode of its own seed."""
    from posbias.experiment import load_experiment

    exp = load_experiment(str(spec), output_dir=str(tmp_path / "exp"))
    seeds = {r.seed for r in exp.runs}
    assert len(seeds) == 5
    if spec.stem == "dyref_full":  # few-shot: 3 sizes x 3 methods x 5 draws; full data: Table 3's 5 x 3 seeds
        by_size = {}
        for run in exp.runs:
            by_size.setdefault(run.name.split("/")[0], set()).add(run.name.split("/", 1)[1])
        assert {k: len(v) for k, v in by_size.items()} == {"n16": 15, "n128": 15, "n1024": 15, "full": 15}
        assert {r.split("/")[0] for r in by_size["full"]} == {"vanilla", "mean", "mask_bidirectional", "mask_causal",
                                                             "mask_independent"}
        assert {r.split("/")[1] for r in by_size["full"]} == {"seed1", "seed2", "seed3"}
    elif spec.stem == "ko_full":  # the stress test's two baselines and the two ensembles on `first`
        assert sorted({r.name.rsplit("/", 1)[0] for r in exp.runs}) == [
            "first/baseline", "first/bias_product_sentence", "first/learned_mixin_h_sentence", "random/baseline"]
        assert len(exp.runs) == 20
    else:
        assert len(exp.runs) == 5 * len(exp.methods)
    for run in exp.runs:
        if run.method == "map_e_forward":
            assert run.checkpoint == str(tmp_path / "exp" / "runs" / "map_e" / f"seed{run.seed}" / "best")
            assert run.decode == {"ensemble": False}


def _remote_groups(tmp_path, item, **env):
    """The --runs groups `remote.sh item ITEM` hands lanes.py (PY: a stand-in that prints its arguments)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    stub = tmp_path / "py"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n', encoding="utf-8")
    stub.chmod(0o755)
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "minilm.done").touch()  # as after `setup` with both pieces of MiniLM
    script = LANES.with_name("remote.sh")
    r = subprocess.run(["bash", str(script), "item", item, "100", "3"], check=False, capture_output=True, text=True,
                       timeout=60,
                       env={**os.environ, "PY": str(stub), "STASH": str(stash), "OUT": str(tmp_path / "out"), **env})
    assert r.returncode == 0, r.stdout + r.stderr
    argv = (stash / f"{item}.log").read_text(encoding="utf-8").splitlines()
    spec = next(p for p in QUEUE_SPECS if p.stem == item)
    assert argv[:2] == ["tools/gpu/lanes.py", str(spec.relative_to(ROOT))], argv[:3]
    return argv[argv.index("--runs") + 1:]


def test_remote_item_orders_the_dyref_queue(tmp_path):
    """Item 3: few-shot groups by size (n128 first), a seed's three methods together; then the full-data
    runs one per group, seed by seed; SIZES, SEEDS, FULL_SEEDS and FULL_METHODS narrow it."""
    groups = _remote_groups(tmp_path, "dyref_full")
    assert groups[:2] == ["n128/vanilla/seed1,n128/mean/seed1,n128/max/seed1",
                          "n128/vanilla/seed2,n128/mean/seed2,n128/max/seed2"]
    assert [g.split("/")[0] for g in groups] == ["n128"] * 5 + ["n1024"] * 5 + ["n16"] * 5 + ["full"] * 15
    assert groups[15:17] == ["full/mean/seed1", "full/mask_independent/seed1"]
    groups = _remote_groups(tmp_path / "b", "dyref_full", SIZES="full 16", SEEDS="4", FULL_SEEDS="2",
                            FULL_METHODS="vanilla mean")
    assert groups == ["full/vanilla/seed2", "full/mean/seed2", "n16/vanilla/seed4,n16/mean/seed4,n16/max/seed4"]
    from posbias.experiment import load_experiment

    spec = ROOT / "reproductions" / "dyref" / "dyref_full.yaml"
    names = {r.name for r in load_experiment(str(spec), output_dir=str(tmp_path / "x")).runs}
    every = _remote_groups(tmp_path / "c", "dyref_full")
    assert {r for g in every for r in g.split(",")} == names  # the default queue is the whole grid, once


@pytest.mark.parametrize("variant, key, value", [("rp_full_reinit", ("model", "reinit_positions_from"), 134),
                                                 ("rp_full_3ep", ("train", "epochs"), 3)])
def test_the_random_padding_variants_are_rp_full_but_for_one_key(tmp_path, variant, key, value):
    """Queue items 3 and 4: the runs are rp_full's (data, recipe, names, lane groups) but for one key: the
    ids from 134 on re-initialised (the first id none of rp_full's training windows reaches, measured with
    reproductions/longest_window.py on the data tools/gpu/pack.sh builds; the spec's comment says how), or
    3 epochs instead of 2."""
    from posbias.experiment import load_experiment

    base, other = (load_experiment(str(ROOT / "reproductions" / "random_padding" / f"{n}.yaml"),
                                   output_dir=str(tmp_path / n)).runs for n in ("rp_full", variant))
    assert [r.name for r in other] == [r.name for r in base]
    section, name = key
    for a, b in zip(base, other):
        da, db = a.config.to_dict(), b.config.to_dict()
        assert db[section].pop(name) == value and da[section].pop(name) != value
        da["train"].pop("output_dir"), db["train"].pop("output_dir")
        assert da == db
    assert _remote_groups(tmp_path / "g", variant, SEEDS="1") == [
        "baseline/seed1,random_padding/seed1,random_padding_k64/seed1"]


def test_lanes_expect_a_run_to_take_what_one_of_its_data_set_took():
    """A short few-shot run does not vouch for a full-data run: a queued run is timed by its own data set."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_lanes", LANES)
    lanes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lanes)
    assert lanes.family("n128/mean/seed1") == "n128" and lanes.family("baseline/seed1") == ""
    assert lanes.expected_seconds({}, "n16/mean/seed1") is None
    took = {"n16": 150.0, "full": 480.0}
    assert lanes.expected_seconds(took, "full/mean/seed3") == 480.0
    assert lanes.expected_seconds(took, "n16/max/seed2") == 150.0
    assert lanes.expected_seconds(took, "n1024/max/seed2") == 150.0  # none of its own yet: the shortest
    assert lanes.expected_seconds({"": 90.0}, "baseline/seed2") == 90.0


def test_remote_item_runs_the_stress_test_a_seed_at_a_time(tmp_path):
    """Item 6: one group per seed holding its four runs, and together the whole grid."""
    from posbias.experiment import load_experiment

    groups = _remote_groups(tmp_path, "ko_full")
    assert groups[0] == ("first/baseline/seed1,random/baseline/seed1,first/bias_product_sentence/seed1,"
                         "first/learned_mixin_h_sentence/seed1")
    assert len(groups) == 5 and all(len(g.split(",")) == 4 for g in groups)
    spec = ROOT / "reproductions" / "first_sentence" / "ko_full.yaml"
    names = {r.name for r in load_experiment(str(spec), output_dir=str(tmp_path / "x")).runs}
    assert {r for g in groups for r in g.split(",")} == names


# ---- the generation item: pack.sh splits the Gemma GGUF one piece a call, remote.sh joins it and runs
# `posbias diagnose generation` at each k within the item's seconds (a fake GGUF and a tiny model here)

GGUF = "gemma3-270m-q4_k_m.gguf"
REMOTE = LANES.with_name("remote.sh")
PACK = LANES.with_name("pack.sh")


def _sh(script, *args, timeout=300, **env):
    r = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                            "CUDA_VISIBLE_DEVICES": "", **{k: str(v) for k, v in env.items()}})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def _tiny_wheel(folder):
    """A pure-Python wheel standing in for the transformers and gguf wheels the last call carries."""
    import zipfile

    folder.mkdir(parents=True)
    info = "gpuprobe-0.1.dist-info"
    with zipfile.ZipFile(folder / "gpuprobe-0.1-py3-none-any.whl", "w") as z:
        z.writestr("gpuprobe.py", "VERSION = '0.1'\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpuprobe\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"gpuprobe.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


def test_generation_pieces_travel_one_a_call_and_setup_joins_them(tmp_path):
    import gzip
    import hashlib
    import shutil

    from tests.generation.test_diagnose import squad_file

    fake = tmp_path / "fake.gguf"  # 2.5 MiB in pieces of 1 MiB: three calls
    fake.write_bytes(bytes(range(256)) * 10240)
    shared = tmp_path / "shared" / "squad_v1.1"
    shared.mkdir(parents=True)
    (shared / "dev-v1.1.json.gz").write_bytes(gzip.compress(squad_file(tmp_path).read_bytes()))
    dest, data = tmp_path / "gpu", tmp_path / "data"
    out = _sh(PACK, ITEMS="generation", GEN_GGUF=fake, GEN_PIECE_MB=1, PACK_WHEELS=0, DEST=dest, GEN_DATA=data,
              POSBIAS_SHARED_DATA=tmp_path / "shared")
    assert sorted(p.name for p in dest.iterdir()) == ["gemma"]  # neither MiniLM nor the part1 wheels
    calls = sorted((dest / "gemma").iterdir())
    assert [c.name for c in calls] == ["call1", "call2", "call3"]
    sha = hashlib.sha256(fake.read_bytes()).hexdigest()
    for c in calls:
        assert (c / f"{GGUF}.sha256").read_text().strip() == sha and (c / f"{GGUF}.pieces").read_text().strip() == "3"
    assert b"".join((c / f"{GGUF}.part{i:02d}").read_bytes() for i, c in enumerate(calls)) == fake.read_bytes()
    assert f'call 3 carries ["{calls[2]}", "{data}"]' in out and f'call 1 carries ["{calls[0]}"]' in out
    assert (data / "dev-v1.1.json.gz").read_bytes() == (shared / "dev-v1.1.json.gz").read_bytes()
    _tiny_wheel(calls[2] / "wheels")

    stash = tmp_path / "stash"
    stash.mkdir()
    for done in ("wheels.done", "posbias.done"):  # posbias is this venv's already
        (stash / done).touch()
    env = dict(STASH=stash, OUT=tmp_path / "out")
    for i, c in enumerate(calls, 1):  # each call carries its own folder only
        one = tmp_path / f"carried{i}" / "gemma"
        one.mkdir(parents=True)
        shutil.move(str(c), one / c.name)
        log = _sh(REMOTE, "setup", DEST=one.parent, **env)
        if i == 1:
            assert "Gemma GGUF: 1 of 3 pieces here so far; missing call2 call3" in log
            refusal = _sh(REMOTE, "item", "generation", "100", DEST=one.parent, GEN_DATA=data / "dev-v1.1.json.gz",
                          **env)
            lines = [x for x in refusal.splitlines() if "item generation:" in x]
            assert len(lines) == 1 and "the Gemma GGUF is incomplete" in lines[0] and "missing call2 call3" in lines[0]
            assert not (tmp_path / "out" / "generation.tar.gz").exists()
    assert "Gemma GGUF joined from 3 pieces (sha256 checked)" in log
    assert (stash / "gemma" / GGUF).read_bytes() == fake.read_bytes() and (stash / "gemma.done").is_file()
    assert not list((stash / "gemma").glob(f"{GGUF}.part*"))
    # the last call's wheels go apart, into llm_site (on PYTHONPATH for this item only), not into the venv
    assert (stash / "llm_site" / "gpuprobe.py").is_file() and (stash / "llm_site.done").is_file()
    assert "llm_site (item generation only): transformers" in (stash / "env.txt").read_text()
    import importlib.util

    assert importlib.util.find_spec("gpuprobe") is None


@pytest.mark.slow
def test_remote_generation_item_runs_each_k_and_archives_reports_and_score_cache(tmp_path):
    import tarfile

    from tests.generation.test_diagnose import squad_file
    from tests.generation.tiny import gemma, tokenizer

    tok = tokenizer()
    model = tmp_path / "model"
    gemma(tok).save_pretrained(model)
    tok.save_pretrained(model)
    data = squad_file(tmp_path)
    run = dict(GEN_MODEL=model, GEN_DATA=data, KS="2 3", SCORINGS="loglik", MITIGATIONS="reorder", GEN_QUESTIONS=4,
               GEN_BOOTSTRAP=20, GEN_ARGS="--min-bucket 2", GEN_PRECISION="fp32", LANES_DEVICE="cpu",
               GEN_MAX_PROMPT_TOKENS=2048)  # the tiny model's context: 4096
    out = tmp_path / "out"
    log = _sh(REMOTE, "item", "generation", "600", STASH=tmp_path / "stash", OUT=out, **run)
    assert "k2 finished" in log and "k3 finished" in log, log
    with tarfile.open(out / "generation.tar.gz") as t:
        names = t.getnames()
        for k in (2, 3):
            res = json.load(t.extractfile(f"generation/k{k}/diagnosis.json"))
            assert res["k"] == k and res["questions"] == 4
            refs = {"loglik, closed-book": 4, "loglik, oracle": 4} if k == 2 else {}  # k = 3 reads them back
            assert res["prompts_computed"] == {"loglik, original": 4 * k, "loglik, reorder-bm25": 4, **refs}
            assert f"generation/logs/k{k}.log" in names
    assert "generation/item.log" in names
    caches = [n for n in names if n.startswith("gen_cache/")]
    assert caches and all(n.startswith("gen_cache/generation") for n in caches)  # not the converted models
    assert any(n.endswith("/fp32/loglik.jsonl") for n in caches)
    # a later session resumes from the archive: nothing scored again
    (tmp_path / "prev.tar.gz").write_bytes((out / "generation.tar.gz").read_bytes())
    log = _sh(REMOTE, "item", "generation", "600", STASH=tmp_path / "stash2", OUT=out,
              **{**run, "KS": "3", "GEN_CACHE_IN": tmp_path / "prev.tar.gz"})
    assert "cached scores merged from" in log and "k3 finished" in log
    with tarfile.open(out / "generation.tar.gz") as t:
        res = json.load(t.extractfile("generation/k3/diagnosis.json"))
    assert not any(res["prompts_computed"].values()) and res["questions"] == 4
    # the time is shared out before anything starts: under ARCHIVE_S + 10 seconds, no k starts, the archive comes
    log = _sh(REMOTE, "item", "generation", "45", STASH=tmp_path / "stash3", OUT=tmp_path / "out3", **run)
    assert "k2: no time left" in log and "k3: no time left" in log and (tmp_path / "out3" / "generation.tar.gz").is_file()
