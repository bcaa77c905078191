"""Shared fixtures: the bundled tiny tokenizer, tiny random encoders, a real 200-question slice.
Helpers that are not fixtures (tiny_config, run_cli, DEMO_DEV, ...) live in tests/helpers."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from posbias.config import RESOURCES, build_config  # noqa: E402

# Also registers the resume tests' `_test_interrupt` perturbation (helpers.INTERRUPT).
from helpers import DEMO_DEV, TINY_ENCODER, tiny_config  # noqa: E402

# The `device` fixture and the rule keeping every other test on the CPU on a GPU box (tiny_config's
# train.device, run_cli's CUDA_VISIBLE_DEVICES and `auto` = cpu in this process): see that module.
# Also ACCELERATE_MIXED_PRECISION unset (the default training precision would follow it).
from helpers.devices import accelerate_precision_unset, auto_device_is_cpu, device  # noqa: E402, F401


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
