"""Shared fixtures: the bundled tiny tokenizer, tiny random encoders, a real 200-question slice.
Helpers that are not fixtures (tiny_config, run_cli, DEMO_DEV, ...) live in tests/helpers."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One thread in each worker and in every process the tests start (the CLI, torchrun, the installed wheel's
# commands, llama.cpp's server), whatever the caller's OMP_NUM_THREADS: the workers keep every core busy,
# and a process with two threads under that load spins at each barrier waiting for the other (llama.cpp
# scoring Gemma: 97 s of CPU with two threads beside two busy processes, 40 s with one).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

from posbias.config import RESOURCES, build_config  # noqa: E402

# Also registers the resume tests' `_test_interrupt` perturbation (helpers.INTERRUPT).
from helpers import DEMO_DEV, TINY_ENCODER, tiny_config  # noqa: E402

# The `device` fixture and the rule keeping every other test on the CPU on a GPU box (tiny_config's
# train.device, run_cli's CUDA_VISIBLE_DEVICES and `auto` = cpu in this process): see that module.
# Also ACCELERATE_MIXED_PRECISION unset (the default training precision would follow it).
from helpers.devices import accelerate_precision_unset, auto_device_is_cpu, device  # noqa: E402, F401


@pytest.fixture(scope="session", autouse=True)
def cache_home(tmp_path_factory):
    """XDG_CACHE_HOME in the session's temporary folder: posbias's default cache (checksums, converted
    GGUFs, scores) and matplotlib's are never written to, or read from, the user's home."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))


@pytest.fixture(scope="session")
def dev_examples():
    """The first 200 questions of the bundled official SQuAD v1.1 dev slice."""
    from posbias.qa.readers import read_qa

    return read_qa(DEMO_DEV).examples[:200]


@pytest.fixture
def tiny_cfg(tmp_path):
    return build_config(tiny_config(tmp_path))


@pytest.fixture(scope="session")
def tiny_bert_folder(tmp_path_factory):
    """A bare random BERT folder (TINY_ENCODER) with the bundled tiny tokenizer: what a Hub id such as
    bert-base-cased resolves to, for tests of users' own Hugging Face scripts."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    out = tmp_path_factory.mktemp("tiny_bert")
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    torch.manual_seed(0)
    config = {k: v for k, v in TINY_ENCODER.items() if k != "model_type"}
    BertModel(BertConfig(vocab_size=len(tok), **config)).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out)


# ------------------------------------------------------------------------------------------ test tiers
# An end-to-end test (marker `e2e`) starts a subprocess, trains a model, or loads a real packaged model
# (MiniLM, Gemma 3 270M); `make test-fast` runs the others (`-m "not e2e"`), `make test` all of them.
# A test is e2e when it carries the `slow` or `integration` marker, or when its own code or a fixture it
# uses (transitively) calls one of E2E_CALLS. Marking by what the code calls keeps a new test in its
# tier without anyone remembering to mark it.
E2E_CALLS = ("run_cli(", "subprocess.", "Popen(", "experiment_run(", "posbias.train(", "api.train(",
             "posbias.demo(", "train_run(", "train_model(", ".train(cfg", "trained_checkpoint", "_cli(",
             '"minilm"', "'minilm'", '"gemma"', "gemma_cache", ".start(", "run_example(", "_example(",
             "trainer.train(", "Trainer(", "torch.multiprocessing", "mp.spawn", "torchrun", "run_ranks(",
             "require_llama(", "require_transformers_serve(")


import re  # noqa: E402

_SOURCES: dict = {}


def _source(obj) -> str:
    """The source of a test or fixture function, read once per function."""
    import inspect

    if obj not in _SOURCES:
        try:
            _SOURCES[obj] = inspect.getsource(obj)
        except (OSError, TypeError):
            _SOURCES[obj] = ""
    return _SOURCES[obj]


_NAME = re.compile(r"\b([A-Za-z_]\w*)\b")
_TESTS = os.path.dirname(os.path.abspath(__file__))


def _is_e2e(item) -> bool:
    """Whether the test, a fixture it uses or a helper function of the tests that either calls (followed
    through every call by name into the tests' own modules) makes one of E2E_CALLS."""
    if item.get_closest_marker("slow") or item.get_closest_marker("integration"):
        return True
    seen, todo = set(), [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        todo += [fd.func for defs in info.name2fixturedefs.values() for fd in defs]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen or not callable(fn):
            continue
        seen.add(fn)
        text = _source(fn)
        if any(call in text for call in E2E_CALLS):
            return True
        namespace = getattr(fn, "__globals__", {})
        for name in set(_NAME.findall(text)):
            helper = namespace.get(name)
            code = getattr(helper, "__code__", None)
            if code is not None and code.co_filename.startswith(_TESTS):  # a helper of the tests' own
                todo.append(helper)
    return False


# ---------------------------------------------------------------------------------- the longest first
# A few tests take minutes each on 2 cores. pytest-xdist's `worksteal` (the Makefile's) gives each worker
# a contiguous share of the collected tests and lets an idle worker steal from the tail of another's, so
# a long test near the end of a share runs alone while the other workers wait for the session to end.
# Each group below goes to the head of one worker's share instead; a module named whole moves whole (its
# module-scoped fixtures are set up once). The Gemma tests share one group: the conversion both read is
# made once, by the first, while the second would wait for it on another worker. Within each share, the
# modules holding an end-to-end test run before those holding none, so that what is left to steal at the
# end is short (a module of 8-20 s tests last in a share kept one worker busy ~25 s after the other).
LONG_FIRST = (
    ("tests/core/test_wheel.py::",),  # a wheel, a venv and every documented command (~2.5 min)
    ("tests/generation/test_lm.py::test_the_packaged_gemma_answers_from_its_context",  # the conversion
     "tests/generation/test_mspoe.py::test_unit_ratios_give_the_real_gemma_back"),
)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """The tiers' marker before `-m` deselects by it; the longest first, and the end-to-end modules before
    the unit ones, once it has (the shares are of what runs)."""
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)
    result = yield
    from helpers.order import long_first

    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = long_first(items, workers, LONG_FIRST, slow=lambda item: item.get_closest_marker("e2e") is not None)
    return result
