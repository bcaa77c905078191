"""Tagging batches: windows padded to the longest of the batch (dynamic padding).

Shape legend: b windows in a batch, s = longest window in the batch.
"""
from __future__ import annotations

import numpy as np
import torch

from .features import IGNORE, TaggingFeatures


def collate(features: TaggingFeatures, idx, *, pad_id: int, padding_side: str = "right",
            with_labels: bool = False) -> dict[str, torch.Tensor]:
    """Pad windows `idx` to the longest of them.

    Returns tensors: input_ids, attention_mask, word_index (-1 at special and padding tokens),
    predict (bool), (b, s); cls_index (b,) (-1 without a leading special token); pad_left (b,)
    tokens of left padding; window (b,); with labels, labels (b, s) (IGNORE at padding).
    """
    idx = np.asarray(idx)
    lens = np.array([len(features.input_ids[i]) for i in idx])
    b, s = len(idx), int(lens.max())
    input_ids = np.full((b, s), pad_id, dtype=np.int64)
    attn = np.zeros((b, s), dtype=np.int64)
    word = np.full((b, s), -1, dtype=np.int64)
    pred = np.zeros((b, s), dtype=bool)
    labels = np.full((b, s), IGNORE, dtype=np.int64) if with_labels else None
    pad_left = (s - lens) if padding_side == "left" else np.zeros(b, dtype=np.int64)
    for r, i in enumerate(idx):
        sl = slice(pad_left[r], pad_left[r] + lens[r])
        input_ids[r, sl] = features.input_ids[i]
        attn[r, sl] = 1
        word[r, sl] = features.word_index[i]
        pred[r, sl] = features.predict[i]
        if labels is not None:
            labels[r, sl] = features.labels[i]
    cls = features.cls_index[idx]
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attn),
        "word_index": torch.from_numpy(word),
        "predict": torch.from_numpy(pred),
        "cls_index": torch.from_numpy(np.where(cls >= 0, cls + pad_left, -1).astype(np.int64)),
        "pad_left": torch.from_numpy(pad_left.astype(np.int64)),
        "window": torch.from_numpy(idx.astype(np.int64)),
    }
    if labels is not None:
        batch["labels"] = torch.from_numpy(labels)
    return batch
