"""Every command of the CLI refuses wrong-typed and out-of-range option values with exit code 2 and
one `error:` line, before anything loads.

The commands and their options are read from `build_parser()`, so a command or option added later is
covered without editing this file; each numeric option must use one of cli.py's checked types."""
from __future__ import annotations

import argparse
import re

import pytest

from helpers import save_tiny_checkpoints
from posbias import cli


def leaf_parsers(parser: argparse.ArgumentParser, path=()):
    """(command words, parser) of every runnable command: `train qa`, `experiment report`, ..."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaf_parsers(sub, path + (name,))


LEAVES = dict(leaf_parsers(cli.build_parser()))


def _takes_value(action) -> bool:
    return action.option_strings and action.nargs != 0 and not isinstance(action, argparse._HelpAction)


def _good(action) -> str:
    """A value the option accepts (for filling required options and the other half of a pair)."""
    if action.choices:
        return list(action.choices)[0]
    if action.type in (cli.unit_float,):
        return "0.5"
    return "1" if action.type is not None else "x"


def base_argv(path, parser) -> list[str]:
    """The command with its required options and positionals filled with placeholders."""
    argv = list(path)
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction) or a.dest == "overrides":
            continue
        n = 2 if a.nargs == 2 else 1
        if a.option_strings and a.required:
            argv += [a.option_strings[0], *[_good(a)] * n]
        elif not a.option_strings:
            argv += ["x"] * n
    return argv


def cases():
    for path, parser in LEAVES.items():
        for a in parser._actions:
            if not _takes_value(a):
                continue
            opt = a.option_strings[-1] if a.option_strings[-1].startswith("--") else a.option_strings[0]
            name = " ".join(path)
            if a.nargs != "?":  # a missing value
                yield pytest.param(path, [opt], opt, id=f"{name} {opt} <missing>")
            values = list(getattr(a.type, "bad", []))
            if a.choices:
                values.append("not-a-choice")
            for v in values:
                # `--opt=VALUE` keeps argparse from reading `-inf` as an option
                argv = [opt, v, _good(a)] if a.nargs == 2 else [f"{opt}={v}"]
                if a.nargs in ("+", "*") and v:
                    argv = [opt, _good(a), v]
                yield pytest.param(path, argv, opt, id=f"{name} {' '.join(argv)}")
            if isinstance(a, cli._Ordered):
                low, high = ("0.2", "0.8") if a.type is cli.unit_float else ("100", "800")
                yield pytest.param(path, [opt, high, low], opt, id=f"{name} {opt} {high} {low}")


def run_main(argv, capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def assert_one_error_line(err: str, names: str):
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert names in lines[0], err  # the message names what was refused
    return lines[0]


@pytest.mark.parametrize("path, bad, option", list(cases()))
def test_every_option_refuses_bad_values_with_one_line_and_exit_2(path, bad, option, capsys, tmp_path):
    argv = base_argv(path, LEAVES[path])
    if len(bad) == 1 and "=" not in bad[0]:  # a value missing: the option last, with nothing after it
        argv += bad
    else:  # the bad option first: argparse stops there
        argv = argv[:len(path)] + bad + argv[len(path):]
    code, err = run_main(argv, capsys)
    assert code == 2, err
    assert_one_error_line(err, option)


def test_the_walk_reaches_every_command_and_numeric_option():
    """Every command is walked, and every int or float option uses one of cli.py's checked types
    (each with its list of values to refuse), not a bare int or float."""
    assert {" ".join(p) for p in LEAVES} >= {
        "train qa", "train tagging", "evaluate qa", "evaluate tagging", "predict qa", "predict tagging",
        "diagnose qa", "diagnose tagging", "diagnose retrieval", "score qa", "score tagging", "export", "explain attention",
        "experiment run", "experiment copy", "experiment report", "data build", "data stats", "demo"}
    bare = [(p, a.option_strings) for p, parser in LEAVES.items() for a in parser._actions
            if a.type in (int, float)]
    assert bare == []


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny random checkpoints: overrides are applied to a model's saved config."""
    return save_tiny_checkpoints(tmp_path_factory.mktemp("models"))


BAD_OVERRIDES = [("train.max_steps=2.5", "train.max_steps"), ("train.eval_batch_size=abc", "train.eval_batch_size"),
                 ("data.max_eval_examples=-1", "data.max_eval_examples"), ("train.eval_batch_tokens=0",
                                                                          "train.eval_batch_tokens"),
                 ("train.num_threads=true", "train.num_threads")]


def override_cases():
    for path, parser in LEAVES.items():
        if not any(a.dest == "overrides" for a in parser._actions):
            continue
        for override, key in BAD_OVERRIDES:
            yield pytest.param(path, override, key, id=f"{' '.join(path)} {override}")
        if any(a.dest == "device" for a in parser._actions):
            yield pytest.param(path, "--device=gpu0", "train.device", id=f"{' '.join(path)} --device=gpu0")


@pytest.mark.parametrize("path, override, key", list(override_cases()))
def test_every_command_with_overrides_refuses_bad_ones_before_loading(path, override, key, models, capsys,
                                                                      tmp_path):
    """The checkpoint's saved config (or the preset) with a bad override: one `posbias: error:` line
    naming the key, exit 2, nothing written."""
    task = path[1] if len(path) > 1 else "qa"
    fill = {"--model": models.get(task, "x"), "--config": "tiny" if task == "qa" else "tiny_tagging",
            "--data": str(tmp_path / "missing.json"), "--output-dir": str(tmp_path / "out")}
    argv = list(path)
    for a in LEAVES[path]._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[-1] if a.option_strings[-1] in fill else a.option_strings[0],
                     fill.get(a.option_strings[-1], fill.get(a.option_strings[0], "x"))]
    if path == ("predict", "qa"):
        argv += ["--question", "Who?", "--context", "Ann met Bob."]
    if path == ("predict", "tagging"):
        argv += ["--text", "Ann met Bob."]
    if path[0] in ("train", "demo"):
        argv += [f"train.output_dir={tmp_path / 'out'}"]
    code, err = run_main(argv + [override], capsys)
    assert code == 2, err
    line = assert_one_error_line(err, key)
    assert line.startswith("posbias: error:"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, names", [
    (["data", "build", "--input", "missing.json", "--out", "o", "--answer-sentence", "0"], "--answer-sentence"),
    (["data", "build", "--input", "missing.json", "--out", "o", "--answer-sentence", "abc"], "--answer-sentence"),
    (["data", "build", "--input", "missing.json", "--out", "o", "--truncate", "5", "--truncate-range", "1", "2"],
     "--truncate"),
])
def test_values_the_command_itself_checks_are_one_line_too(argv, names, capsys):
    code, err = run_main(argv, capsys)
    assert code == 2, err
    assert_one_error_line(err, names)


@pytest.mark.parametrize("argv, message", [
    (["data", "build", "--input", "i", "--out", "o", "--truncate", "0"], "argument --truncate: must be an integer >= 1"),
    (["data", "build", "--input", "i", "--out", "o", "--truncate-range", "800", "100"],
     "argument --truncate-range: the first value must be <= the second, got 800 100"),
    (["data", "build", "--input", "i", "--out", "o", "--sample", "0"], "argument --sample: must be an integer >= 1"),
    (["diagnose", "qa", "--model", "m", "--data", "d", "--output-dir", "o", "--x", "0"], "argument --x: must be"),
    (["diagnose", "qa", "--model", "m", "--data", "d", "--output-dir", "o", "--bootstrap-samples", "-1"],
     r"argument --bootstrap-samples: must be an integer in \[0, 1000000\], got -1"),
    (["diagnose", "qa", "--model", "m", "--data", "d", "--output-dir", "o", "--min-bucket", "0"], "--min-bucket: must be"),
    (["diagnose", "tagging", "--model", "m", "--data", "d", "--output-dir", "o", "--batch-tokens", "0"],
     "argument --batch-tokens: must be an integer >= 1"),
    (["diagnose", "tagging", "--model", "m", "--data", "d", "--output-dir", "o", "--k-max", "0"], "--k-max: must be"),
    (["diagnose", "tagging", "--model", "m", "--data", "d", "--output-dir", "o", "--quantiles", "0.2", "1.5"],
     r"argument --quantiles: must be a finite number in \[0, 1\], got 1.5"),
    (["diagnose", "tagging", "--model", "m", "--data", "d", "--output-dir", "o", "--quantiles", "0.8", "0.2"],
     "argument --quantiles: the first value must be <= the second"),
    (["experiment", "report", "d", "--bootstrap-samples", "-5"], "argument --bootstrap-samples: must be"),
    (["predict", "qa", "--model", "m", "--n-best", "0"], "argument --n-best: must be an integer >= 1, got 0"),
])
def test_the_reported_option_values_are_refused(argv, message, capsys):
    code, err = run_main(argv, capsys)
    assert code == 2
    assert re.search(message, assert_one_error_line(err, "error:")), err
