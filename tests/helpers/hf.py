"""Shared by the Hugging Face tests (fronts/test_hf.py, core/test_plugins.py): a tiny random BERT
token classifier, the features a standard HF NER script feeds its collator, a tiny Trainer."""
import torch
from transformers import BertConfig, BertForTokenClassification

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
SENTENCES = [(["Ana", "went", "to", "Oslo"], ["B-PER", "O", "O", "B-LOC"]),
             (["Bo", "Berg", "smiled"], ["B-PER", "I-PER", "O"]),
             (["It", "rained", "in", "New", "York", "today"], ["O", "O", "O", "B-LOC", "I-LOC", "O"]),
             (["Hi"], ["O"])]


def bert(tok, **kw):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), max_position_embeddings=64, num_labels=len(LABELS),
                     id2label=dict(enumerate(LABELS)), label2id={t: i for i, t in enumerate(LABELS)}, **SMALL, **kw)
    return BertForTokenClassification(cfg)


def features(tok, sentences=SENTENCES):
    """What a standard HF NER script feeds its collator: first sub-token labelled, the rest -100."""
    out = []
    for words, tags in sentences:
        enc = tok(words, is_split_into_words=True)
        prev, labels = None, []
        for w in enc.word_ids():
            labels.append(-100 if w is None or w == prev else LABELS.index(tags[w]))
            prev = w
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
    return out


def tiny_trainer(tmp_path, model, tok, collator, callbacks=()):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    ds = Dataset.from_list(features(tok) * 4)
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=3, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, learning_rate=1e-3, report_to="none", save_strategy="no",
                             logging_steps=1, use_cpu=True, seed=0)
    return Trainer(model=model, args=args, train_dataset=ds, eval_dataset=ds, data_collator=collator,
                   callbacks=list(callbacks))
