"""A run's tagging inputs: the tokenizer for word-split text, the data read with the config's options
(tag scheme, D* length bounds over the pooled files) and the label list. Shared by the task, the
model, evaluation and diagnosis, below all of them.
"""
from __future__ import annotations

from ..config import resolve_path
from ..errors import ConfigError, DataError
from ..hf_datasets import is_hf_dataset
from .readers import read_tagging, read_tagging_dataset
from .schemes import convert


def tagging_tokenizer(path: str, as_saved: bool = False):
    """A fast tokenizer for word-split input: byte-level BPE (RoBERTa, GPT-2, BLOOM) must see a
    space before every word, as in running text, or each word is tokenized as a text start.
    `as_saved`: a checkpoint's own tokenizer class (`open_tokenizer`)."""
    from ..encoders import open_tokenizer  # loads torch: `posbias.tagging` stays without it

    try:
        return open_tokenizer(path, as_saved=as_saved, add_prefix_space=True)
    except ConfigError:  # a tokenizer class that takes no such option (any other problem recurs below)
        return open_tokenizer(path, as_saved=as_saved)


def read_for(spec, cfg):
    """A tagging file (or shards) read with the config's data options, tags converted to
    `data.label_scheme` when one is set."""
    d = cfg.data
    if is_hf_dataset(spec):  # a datasets.Dataset of word and tag lists
        ds = read_tagging_dataset(spec, tags_column=d.tags_column, scheme=d.scheme, on_bad_record=d.on_bad_record)
    else:
        paths = [resolve_path(p) for p in spec] if isinstance(spec, (list, tuple)) else resolve_path(spec)
        ds = read_tagging(paths, on_bad_record=d.on_bad_record, **d.read_options())
    if d.length_quantiles is not None:  # D*: the middle of the (pooled) length distribution
        from .duplicated import length_subset  # loads torch: `posbias.tagging` stays without it

        ds.examples, info = length_subset(ds.examples, tuple(d.length_quantiles), pool=length_pool(cfg))
        ds.length_subset = info
    # Entity tags only: per-word labels (POS, scheme none) have no scheme to convert to.
    if d.label_scheme != "auto" and ds.scheme not in (d.label_scheme, "none"):
        for e in ds.examples:
            e.tags = convert(e.tags, ds.scheme, d.label_scheme)
        ds.scheme = d.label_scheme
    return ds


_POOL_LENGTHS: dict = {}  # (file, its mtime and size, read options) -> sentence lengths


def length_pool(cfg):
    """(sentence lengths, the files they come from) whose quantiles bound D* under `data.length_pool:
    pooled` (the authors' `trim_dataset` pools train, dev and test); None under `split`, or when
    there is nothing to pool (a model without its training files: each file then uses its own).

    The files: `data.length_pool_files`, else the run's `data.train_file` and `data.eval_file`
    (in-memory `datasets`, named `datasets:...` in a saved config, cannot be read again: skipped).
    Each file is read once per process."""
    import os

    import numpy as np

    d = cfg.data
    if d.length_pool != "pooled":
        return None
    key, specs = "data.length_pool_files", d.length_pool_files
    if specs is None:  # a train or eval file given as shards (a list) is one entry
        key, specs = "data.train_file / data.eval_file", [d.train_file, d.eval_file]
    elif isinstance(specs, str):
        specs = [specs]
    specs = [s for s in specs if isinstance(s, (str, list)) and not str(s).startswith("datasets:")]
    lengths, names = [], []
    options = tuple(sorted(d.read_options().items()))
    for spec in specs:
        paths = [resolve_path(p) for p in spec] if isinstance(spec, list) else [resolve_path(spec)]
        try:
            stamp = tuple((p, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths)
        except OSError as e:
            raise ConfigError(f"data.length_pool: pooled reads {key}, but {e.filename} cannot be read "
                              f"({e.strerror}); name the files to pool in data.length_pool_files, or set "
                              "data.length_pool=split") from None
        if (stamp, options) not in _POOL_LENGTHS:
            try:
                ds = read_tagging(paths if len(paths) > 1 else paths[0], on_bad_record=d.on_bad_record,
                                  **d.read_options())
            except DataError as e:
                raise ConfigError(f"data.length_pool ({key}): {e}") from None
            _POOL_LENGTHS[(stamp, options)] = np.array([len(e.words) for e in ds.examples], dtype=np.int64)
        lengths.append(_POOL_LENGTHS[(stamp, options)])
        names.append(", ".join(paths))
    if not names:
        return None
    return np.concatenate(lengths), names


def label_list(dataset) -> list[str]:
    """The model's labels: "O" first (entity schemes), then the training tags sorted."""
    tags = dataset.tag_set()
    return (["O"] if "O" in tags else []) + [t for t in tags if t != "O"]
