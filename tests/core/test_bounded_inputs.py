"""Hostile or careless inputs fail fast, in bounded memory, with one line naming the file and the
limit: a model folder's own code never runs (whatever stdin answers), YAML alias bombs, devices and
pipes as data, gzip bombs, oversized and deeply nested JSON in model and state files."""
import contextlib
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import tracemalloc
import zlib
from pathlib import Path

import pytest
import torch

from posbias.checkpoint import load_checkpoint, save_checkpoint
from posbias.cli import main
from posbias.config import PRESETS, build_config, load_config, load_yaml, parse_overrides
from posbias.encoders import weight_tensors
from posbias.errors import ConfigError, DataError
from posbias.experiment import load_experiment
from posbias.limits import DATA_LIMIT_ENV, YAML_LIMIT, YAML_MAX_NODES, load_json
from posbias.qa.readers import read_qa
from posbias.records import read_text
from posbias.tagging.conll import read_conll

from helpers import BIN, DEMO_DEV, tiny_config

TINY_YAML = str(PRESETS / "tiny.yaml")
NO_CODE = "posbias does not run a model folder's code"


def _limited_child():
    """A child may use at most 3 GiB of address space: a regression fails there, it does not
    take the machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@contextlib.contextmanager
def address_space_cap(extra: int = 1 << 30):
    """Within the block this process may grow by at most `extra` bytes of address space, so that a
    regression (reading /dev/zero, gunzipping a bomb whole) fails with MemoryError instead of
    taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[0]) * resource.getpagesize()
    cap = now + extra if hard == resource.RLIM_INFINITY else min(now + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_posbias(*args, stdin: str = "", env: dict | None = None, timeout: int = 180):
    """`posbias ARGS` in a subprocess with `stdin`, offline, bounded in memory and time."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([str(BIN / "posbias"), *map(str, args)], input=stdin, capture_output=True, text=True,
                          env=full_env, timeout=timeout, preexec_fn=_limited_child)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random QA checkpoint (save_checkpoint of an untrained model: no training needed)."""
    from posbias.qa.model import build_model
    from posbias.tasks import get_task

    root = tmp_path_factory.mktemp("ckpt") / "qa"
    torch.manual_seed(0)
    cfg = build_config(tiny_config())
    tokenizer = get_task("qa").load_tokenizer(cfg)
    save_checkpoint(build_model(cfg.model, tokenizer, null_answer=False), cfg, tokenizer, root)
    return root


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """(config file, run folder) of a 1-step tiny run with a checkpoint to resume from."""
    import posbias

    tmp = tmp_path_factory.mktemp("resumable")
    cfg = build_config(tiny_config(tmp, train={"max_steps": 1, "save_every": 1}, data={"eval_file": None}))
    posbias.train(cfg, progress=False)
    cfg_file = tmp / "cfg.yaml"
    cfg_file.write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    return cfg_file, tmp / "run"


# ---- 1. a model folder's own code never runs

EVIL_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import PretrainedConfig, PreTrainedTokenizerFast
class EvilConfig(PretrainedConfig):
    model_type = "evilbert"
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""
EVIL_CONFIG = {"model_type": "evilbert", "architectures": ["EvilForQuestionAnswering"],
               "auto_map": {"AutoConfig": "evil_code.EvilConfig", "AutoModel": "evil_code.EvilConfig",
                            "AutoModelForQuestionAnswering": "evil_code.EvilConfig"}}
EVIL_TOKENIZER = {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil_code.EvilTokenizer", None]}}


def plant_code(folder: Path, marker: Path, config: bool = True, tokenizer: bool = False) -> Path:
    """Put a `.py` file into `folder` that, once imported, creates `marker`, and name it in the
    folder's config.json and/or tokenizer_config.json (`auto_map`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evil_code.py").write_text(EVIL_CODE.format(marker=str(marker)), encoding="utf-8")
    if config:
        (folder / "config.json").write_text(json.dumps(EVIL_CONFIG), encoding="utf-8")
    if tokenizer:
        (folder / "tokenizer_config.json").write_text(json.dumps(EVIL_TOKENIZER), encoding="utf-8")
    return folder


def _bare_folder(tmp_path, marker, checkpoint):
    return plant_code(tmp_path / "evil", marker)


def _tokenizer_folder(tmp_path, marker, checkpoint):
    folder = tmp_path / "evil_tok"
    shutil.copytree(checkpoint, folder)
    for f in ("config.json", "model.safetensors", "posbias.yaml", "posbias_model.json"):
        (folder / f).unlink()
    return plant_code(folder, marker, config=False, tokenizer=True)


def _checkpoint_with(config: bool, tokenizer: bool):
    def make(tmp_path, marker, checkpoint):
        folder = tmp_path / "evil_ckpt"
        shutil.copytree(checkpoint, folder)
        return plant_code(folder, marker, config=config, tokenizer=tokenizer)
    return make


REMOTE_CODE_ROUTES = {
    "evaluate --model, an HF folder": (_bare_folder, lambda f, out: ["evaluate", "qa", "--model", f, "--data", DEMO_DEV]),
    "train model.name_or_path": (_bare_folder, lambda f, out: ["train", "qa", "-c", TINY_YAML,
                                                               f"model.name_or_path={f}", f"train.output_dir={out}"]),
    "train model.tokenizer": (_tokenizer_folder, lambda f, out: ["train", "qa", "-c", TINY_YAML, f"model.tokenizer={f}",
                                                                 f"train.output_dir={out}"]),
    "a posbias checkpoint's config.json": (_checkpoint_with(config=True, tokenizer=False),
                                           lambda f, out: ["evaluate", "qa", "--model", f, "--data", DEMO_DEV]),
    "a posbias checkpoint's tokenizer": (_checkpoint_with(config=False, tokenizer=True),
                                         lambda f, out: ["evaluate", "qa", "--model", f, "--data", DEMO_DEV]),
}


@pytest.mark.parametrize("route", list(REMOTE_CODE_ROUTES))
def test_a_model_folder_with_its_own_code_runs_nothing_even_on_yes(tmp_path, checkpoint, route):
    make, argv = REMOTE_CODE_ROUTES[route]
    marker = tmp_path / "pwned"
    folder = make(tmp_path, marker, checkpoint)
    r = run_posbias(*argv(folder, tmp_path / "out"), stdin="y\n" * 200,
                    env={"HF_MODULES_CACHE": str(tmp_path / "modules")}, timeout=120)
    assert not marker.exists(), "the folder's code ran"
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and NO_CODE in r.stderr and str(folder) in r.stderr, r.stderr[-2000:]
    assert "[y/N]" not in r.stdout + r.stderr  # transformers never asked


def test_a_known_model_type_with_an_auto_map_loads_the_builtin_class(tmp_path, checkpoint):
    """auto_map beside a model_type transformers has: the built-in class loads, the code does not run."""
    marker = tmp_path / "pwned"
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": EVIL_CONFIG["auto_map"]}), encoding="utf-8")
    plant_code(folder, marker, config=False)
    model, _, _ = load_checkpoint(folder)
    assert type(model.encoder).__name__ == "BertModel" and not marker.exists()


# ---- 2. YAML: alias bombs and other documents past the limits

def alias_bomb(levels: int, width: int = 10, indent: str = "") -> str:
    """A "billion laughs" document: `width ** levels` scalars once the aliases are expanded."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def flow_bomb(levels: int, width: int = 10) -> str:
    """The same bomb as one flow mapping, for a command-line override value."""
    items = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    items += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "{" + ", ".join(items) + "}"


# 10 ** 7 values expanded: far past the node limit, yet small enough that an unbounded loader would
# fail this test by time and memory rather than take the machine down.
LEVELS = 7


def _config_file(tmp_path, checkpoint):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(LEVELS), encoding="utf-8")
    return lambda: load_config(path)


def _override(tmp_path, checkpoint):
    return lambda: build_config(tiny_config(), [f"model.encoder={flow_bomb(LEVELS)}"])


def _checkpoint_yaml(tmp_path, checkpoint):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    (folder / "posbias.yaml").write_text(alias_bomb(LEVELS), encoding="utf-8")
    return lambda: load_checkpoint(folder)


def _experiment_spec(tmp_path, checkpoint):
    path = tmp_path / "exp.yaml"
    path.write_text("name: bomb\nbase: tiny\nseeds: [1]\nmethods:\n  base: {}\n  big:\n" + alias_bomb(LEVELS, indent="    "),
                    encoding="utf-8")
    return lambda: load_experiment(path, output_dir=str(tmp_path / "exp"))


def _model_encoder(tmp_path, checkpoint):
    path = tmp_path / "enc.yaml"
    path.write_text("model:\n  name_or_path: null\n  tokenizer: tiny\n  encoder:\n    model_type: bert\n"
                    + alias_bomb(LEVELS, indent="    "), encoding="utf-8")
    return lambda: load_config(path)


YAML_ROUTES = {"config file": _config_file, "override value": _override, "checkpoint posbias.yaml": _checkpoint_yaml,
               "experiment spec": _experiment_spec, "model.encoder": _model_encoder}


@pytest.mark.parametrize("route", list(YAML_ROUTES))
def test_a_yaml_alias_bomb_is_refused_fast_in_bounded_memory(tmp_path, checkpoint, route):
    load = YAML_ROUTES[route](tmp_path, checkpoint)
    tracemalloc.start()
    try:
        with address_space_cap(), pytest.raises(ConfigError, match=f"more than {YAML_MAX_NODES:,} values .* alias bomb") as e:
            load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value)
    # Bounded memory is bounded work here: the expansion is what costs time. (No wall-clock limit:
    # a loaded CI machine must not fail it.)
    assert peak < 30 << 20, f"{peak / 2 ** 20:.0f} MiB"


def test_the_761_byte_bomb_through_the_cli_is_one_line(tmp_path):
    """The issue's bomb (9 levels of 9: 387 million values once expanded) as model.encoder of a
    config that trains: an unbounded loader ran 2 minutes and grew past 2 GB on it."""
    path = tmp_path / "bomb.yaml"
    path.write_text("model:\n  name_or_path: null\n  tokenizer: tiny\n  encoder:\n    model_type: bert\n"
                    + alias_bomb(9, width=9, indent="    ")
                    + f"data: {{train_file: 'demo:train', eval_file: null}}\ntrain: {{output_dir: {tmp_path / 'run'}}}\n",
                    encoding="utf-8")
    r = run_posbias("train", "qa", "-c", path, timeout=300)  # a hang guard, not a speed target
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "alias bomb" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, message", [
    ("a: &a [*a]\n", "a YAML alias refers to a node that contains it"),
    ("a: &a {b: *a}\n", "a YAML alias refers to a node that contains it"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", "YAML nested deeper than 100 levels"),
    ("a: " + "[" * 3000 + "]" * 3000 + "\n", "YAML nested too deeply"),
    ("# padding\n" * (YAML_LIMIT // 10 + 1), "larger than the 4 MiB limit for"),
])
def test_yaml_past_the_other_limits_is_one_config_error(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as e:
        load_yaml(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=message) as e:
        parse_overrides([f"model.encoder={text}"])
    assert str(e.value).startswith("override model.encoder: ") and len(str(e.value)) < 200


def test_anchors_that_expand_a_little_still_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: &b {lr: 0.001, steps: 3}\nrun: {<<: *b, steps: 4}\nlist: [*b, *b]\n", encoding="utf-8")
    assert load_yaml(path) == {"base": {"lr": 0.001, "steps": 3}, "run": {"lr": 0.001, "steps": 4},
                               "list": [{"lr": 0.001, "steps": 3}] * 2}


# ---- 3. data files: devices, pipes, size limits, gzip bombs

def test_dev_zero_as_data_is_refused_at_once():
    r = run_posbias("score", "qa", "--data", "/dev/zero", "--predictions", DEMO_DEV, timeout=120)
    assert r.returncode == 2 and r.stderr == "posbias: error: /dev/zero: is a device, not a data file: give a " \
                                             "regular file (or a pipe)\n", r.stderr[-2000:]


@pytest.mark.parametrize("read", [read_qa, read_conll, read_text], ids=["qa", "conll", "read_text"])
def test_a_device_is_refused_by_every_reader(read):
    with address_space_cap(), pytest.raises(DataError, match="/dev/zero: is a device"):
        read("/dev/zero")


def test_a_pipe_is_read_up_to_the_limit_only(tmp_path, monkeypatch):
    """A pipe has no size to check first: it is read up to the limit (`POSBIAS_MAX_FILE_BYTES`)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed():
        try:
            with open(fifo, "wb") as f:
                for _ in range(64):
                    f.write(b"x" * 65536)  # 4 MiB in all
        except BrokenPipeError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    monkeypatch.setenv(DATA_LIMIT_ENV, str(1 << 20))
    with pytest.raises(DataError, match=rf"fifo: larger than the 1 MiB limit for data file \(raise it with "
                                        rf"{DATA_LIMIT_ENV}=<bytes>\)"):
        read_text(fifo)


def test_the_data_limit_is_read_at_call_time_and_checked(monkeypatch):
    size = os.path.getsize(DEMO_DEV)
    monkeypatch.setenv(DATA_LIMIT_ENV, str(size - 1))
    with pytest.raises(DataError, match="dev.json.gz: larger than the .* limit for data file"):
        read_qa(DEMO_DEV)
    monkeypatch.setenv(DATA_LIMIT_ENV, str(size + 1))  # the file fits, its gunzipped text does not
    with pytest.raises(DataError, match=r"larger than the .* limit for data file \(gunzipped\)"):
        read_qa(DEMO_DEV)
    monkeypatch.setenv(DATA_LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match=f"{DATA_LIMIT_ENV}='lots': must be a positive number of bytes"):
        read_qa(DEMO_DEV)
    monkeypatch.delenv(DATA_LIMIT_ENV)
    assert len(read_qa(DEMO_DEV).examples) > 0


@pytest.fixture(scope="module")
def gzip_bomb(tmp_path_factory):
    """300 MB of zeros streamed through gzip: a ~300 KB file (a 1000x ratio)."""
    path = tmp_path_factory.mktemp("bomb") / "train.json.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(1 << 20)
    with open(path, "wb") as f:
        for _ in range(300):
            f.write(z.compress(block))
        f.write(z.flush())
    assert path.stat().st_size < 400_000
    return path


@pytest.mark.parametrize("read", [read_qa, read_conll, read_text], ids=["qa", "conll", "read_text"])
def test_a_gzip_bomb_is_refused_in_bounded_time_and_memory(gzip_bomb, read):
    tracemalloc.start()
    try:
        with address_space_cap(), pytest.raises(DataError, match=r"train\.json\.gz: gunzips to more than 100x its "
                                                                 r"size .* decompression bomb"):
            read(gzip_bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20, f"{peak / 2 ** 20:.0f} MiB"


def test_gzip_members_padding_and_damage(tmp_path):
    """Streaming keeps gzip.decompress's reading: several members, zero padding; a cut or trailing
    garbage is named."""
    text = (Path(DEMO_DEV).parent / "dev.json.gz").read_bytes()
    plain = gzip.decompress(text)
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(plain[:1000]) + b"\0\0" + gzip.compress(plain[1000:]))
    assert read_text(path) == plain.decode("utf-8")
    path.write_bytes(text[:-10])
    with pytest.raises(DataError, match="corrupt gzip data"):
        read_text(path)
    path.write_bytes(text + b"garbage")
    with pytest.raises(DataError, match="corrupt gzip data: not gzip data after byte"):
        read_text(path)


# ---- 4. model and state files: deeply nested, damaged, oversized JSON

DEEP = "[" * 100_000


def _evaluate(folder, tmp_path, file):
    return ["evaluate", "qa", "--model", str(folder), "--data", DEMO_DEV]


def _resume(cfg_file):
    return lambda folder, tmp_path, file: ["train", "qa", "-c", str(cfg_file), "train.max_steps=2", "--resume"]


@pytest.mark.parametrize("name", ["posbias_model.json", "config.json", "tokenizer_config.json", "tokenizer.json",
                                  "special_tokens_map.json"])
@pytest.mark.parametrize("content", [DEEP, "[" * 150 + "]" * 150, '{"a": "\udc80"}', "{"],
                         ids=["recursion", "deep", "surrogate", "truncated"])
def test_a_damaged_json_file_in_a_checkpoint_is_one_line(tmp_path, checkpoint, capsys, name, content):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    (folder / name).write_bytes(content.encode("utf-8", "surrogatepass"))
    assert main(["evaluate", "qa", "--model", str(folder), "--data", DEMO_DEV]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder / name}: " in err, err


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_device_in_place_of_a_model_file_is_one_line(tmp_path, checkpoint, capsys, name):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    (folder / name).unlink()
    (folder / name).symlink_to("/dev/zero")
    with address_space_cap():
        assert main(["evaluate", "qa", "--model", str(folder), "--data", DEMO_DEV]) == 2
    assert capsys.readouterr().err == f"posbias: error: {folder / name}: is a device, not a model file: give a " \
                                      "regular file (or a pipe)\n"


@pytest.mark.parametrize("name", ["trainer_state.json", "training_state.json"])
def test_deeply_nested_resume_state_is_one_line(tmp_path, resumable, capsys, name):
    cfg_file, run = resumable
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    d = json.loads(cfg_file.read_text(encoding="utf-8"))
    d["train"]["output_dir"] = str(copy)
    (tmp_path / "cfg.yaml").write_text(json.dumps(d), encoding="utf-8")
    (copy / "checkpoints" / "last" / name).write_text(DEEP, encoding="utf-8")
    assert main(["train", "qa", "-c", str(tmp_path / "cfg.yaml"), "train.max_steps=2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{copy / 'checkpoints' / 'last' / name}: JSON nested deeper than" in err, err


def test_deeply_nested_predictions_to_score_is_one_line(tmp_path, capsys):
    path = tmp_path / "predictions.json"
    path.write_text(DEEP, encoding="utf-8")
    assert main(["score", "qa", "--data", DEMO_DEV, "--predictions", str(path)]) == 2
    assert capsys.readouterr().err == f"posbias: error: {path}: JSON nested deeper than 100 levels\n"


def test_a_deeply_nested_weights_index_is_one_line(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(DEEP, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model\.safetensors\.index\.json: JSON nested deeper than 100 levels"):
        weight_tensors(str(tmp_path), lambda name: True)


def test_load_json_bounds_size_and_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"a": list(range(1000))}), encoding="utf-8")
    assert load_json(path, "test file")["a"][-1] == 999
    with pytest.raises(ConfigError, match=r"x\.json: larger than the 100 bytes limit for test file$"):
        load_json(path, "test file", limit=100)
    with pytest.raises(DataError, match=r"x\.json: larger than the 100 bytes limit for test file \(raise it"):
        load_json(path, "test file", limit=100, data=True)
    with pytest.raises(ConfigError, match="/dev/zero: is a device"):
        load_json("/dev/zero", "test file")


def test_the_default_data_limit_fits_the_machines_memory(monkeypatch):
    """A stream is held whole while it is parsed (about 1.1x its size at the peak): the default bound is
    4 GiB or a quarter of the machine's memory, whichever is smaller; the variable still overrides it."""
    from posbias import limits

    monkeypatch.delenv(DATA_LIMIT_ENV, raising=False)
    monkeypatch.setattr(limits, "memory_bytes", lambda: 8 * 1024**3)
    assert limits.data_limit() == 2 * 1024**3
    monkeypatch.setattr(limits, "memory_bytes", lambda: 64 * 1024**3)
    assert limits.data_limit() == limits.DEFAULT_DATA_LIMIT
    monkeypatch.setattr(limits, "memory_bytes", lambda: None)
    assert limits.data_limit() == limits.DEFAULT_DATA_LIMIT
    monkeypatch.setattr(limits, "memory_bytes", lambda: 8 * 1024**3)
    monkeypatch.setenv(DATA_LIMIT_ENV, str(5 * 1024**3))
    assert limits.data_limit() == 5 * 1024**3
