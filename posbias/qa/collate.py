"""QA batches: windows padded to the longest of the batch (dynamic padding), with their masks.

Shape legend: b windows in a batch, s = longest window in the batch (no padding to max_seq_len).
"""
from __future__ import annotations

import numpy as np
import torch

from .features import QAFeatures


def collate(features: QAFeatures, idx, *, pad_id: int, padding_side: str = "right",
            with_labels: bool = False) -> dict[str, torch.Tensor]:
    """Pad windows `idx` to the longest of them.

    Returns tensors: input_ids, attention_mask, token_type_ids (if any) (b, s); span_mask (b, s)
    bool = context tokens (plus [CLS] for training features with `null_candidate`);
    question_mask (b, s) bool = question tokens (without features' question masks: every real token
    outside the context but [CLS]); max_context (b, s) bool; cls_index (b,); pad_left (b,) tokens of
    left padding, which shift every stored token position; window (b,) window indices; with labels
    start/end_positions (b,).
    """
    idx = np.asarray(idx)
    lens = np.array([len(features.input_ids[i]) for i in idx])
    b, s = len(idx), int(lens.max())
    input_ids = np.full((b, s), pad_id, dtype=np.int64)
    attn = np.zeros((b, s), dtype=np.int64)
    ctx = np.zeros((b, s), dtype=bool)
    maxc = np.zeros((b, s), dtype=bool)
    qmask = np.zeros((b, s), dtype=bool)
    types = np.zeros((b, s), dtype=np.int64) if features.token_type_ids is not None else None
    pad_left = (s - lens) if padding_side == "left" else np.zeros(b, dtype=np.int64)
    for r, i in enumerate(idx):
        sl = slice(pad_left[r], pad_left[r] + lens[r])
        input_ids[r, sl] = features.input_ids[i]
        attn[r, sl] = 1
        ctx[r, sl] = features.offsets[i][:, 0] >= 0
        maxc[r, sl] = features.max_context[i]
        if features.question_mask is not None:
            qmask[r, sl] = features.question_mask[i]
        else:
            qmask[r, sl] = ~ctx[r, sl]
            qmask[r, pad_left[r] + features.cls_index[i]] = False
        if types is not None:
            types[r, sl] = features.token_type_ids[i]
        if features.null_candidate:
            # Training windows that may be labelled [CLS] (BERT's pre-processing, v1 included): [CLS]
            # competes in every window's softmax, as a v2 head's null position does.
            ctx[r, pad_left[r] + features.cls_index[i]] = True
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attn),
        "span_mask": torch.from_numpy(ctx),
        "question_mask": torch.from_numpy(qmask),
        "max_context": torch.from_numpy(maxc),
        "cls_index": torch.from_numpy(features.cls_index[idx] + pad_left),
        "pad_left": torch.from_numpy(pad_left.astype(np.int64)),
        "window": torch.from_numpy(idx.astype(np.int64)),
    }
    if types is not None:
        batch["token_type_ids"] = torch.from_numpy(types)
    if with_labels:
        batch["start_positions"] = torch.from_numpy(features.start_positions[idx] + pad_left)
        batch["end_positions"] = torch.from_numpy(features.end_positions[idx] + pad_left)
    return batch
