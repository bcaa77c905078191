"""The CLI and config references are generated from the code: every command, option and config key
has the text the reference shows."""
from __future__ import annotations

import argparse

from . import generator


def test_every_cli_command_and_option_has_a_help_text():
    missing = generator().undocumented_cli()
    assert not missing, "commands / options without a help text:\n" + "\n".join(missing)


def test_every_config_key_has_a_field_docstring():
    missing = generator().undocumented_config()
    assert not missing, "config keys without a field docstring:\n" + "\n".join(missing)


def test_the_cli_page_lists_every_command_and_option():
    from posbias.cli import build_parser

    gen = generator()
    page = gen.cli_markdown(build_parser())
    for words, _, parser in gen.walk_parser(build_parser()):
        assert "\n" + "#" * (min(len(words), 4) + 1) + " " + " ".join(words) + "\n" in page
        for action in gen.options(parser):
            assert gen.md_code(gen.option_name(action)) in page, (words, action.option_strings or action.dest)


def test_the_cli_walk_finds_nested_commands_and_flags_missing_help():
    gen = generator()
    ap = argparse.ArgumentParser(prog="x", description="tool")
    sub = ap.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run it")
    run.add_argument("--fast", action="store_true", help="quickly")
    run.add_argument("--n", type=int, default=3)
    deep = run.add_subparsers(dest="what").add_parser("deeper")
    deep.add_argument("path")
    walked = [words for words, _, _ in gen.walk_parser(ap)]
    assert walked == [("posbias",), ("posbias", "run"), ("posbias", "run", "deeper")]
    assert sorted(gen.undocumented_cli(ap)) == ["posbias run --n", "posbias run deeper", "posbias run deeper path"]
    page = gen.cli_markdown(ap)
    assert "| `--n N` | `3` |" in page and "| `--fast` |   | quickly |" in page
    assert "`int | null`" in gen.config_markdown()  # a pipe inside a code span does not split a cell


def test_the_config_page_lists_every_key_with_type_and_default():
    from posbias.qa.config import QAConfig
    from posbias.tagging.config import TaggingConfig
    from posbias.typed import dotted_keys

    gen = generator()
    page = gen.config_markdown()
    for cls in (QAConfig, TaggingConfig):
        for key in dotted_keys(cls):
            assert f"`{key}`" in page, key
    assert "| `train.lr` | `float`, &gt; 0 | `0.0002` |" in page
    assert "`train.debias.method`" in page  # a section that may be null is walked too
    assert "### `rpp` {#perturbation-rpp}" in page and "`max_len`" in page


def test_field_docs_reads_attribute_docstrings_through_subclasses():
    import dataclasses

    gen = generator()

    @dataclasses.dataclass
    class Base:
        a: int = 1
        """the a"""
        b: int = 2

    @dataclasses.dataclass
    class Child(Base):
        c: str = "x"
        """the c"""

    assert gen.field_docs(Child) == {"a": "the a", "c": "the c"}
