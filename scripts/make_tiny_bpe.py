"""Build the tiny byte-level BPE test tokenizers (run once; outputs are committed).

Writes into posbias/resources/:
  tiny_bpe_roberta/  RoBERTa-style: <s> x </s>, a <pad> token (padding_idx 1 in RoBERTa models)
  tiny_bpe_gpt2/     GPT-2-style: no special tokens around a sequence and no pad token (posbias
                     gives it one), <|endoftext|> only
Both share one 2,000-entry byte-level BPE model trained on the bundled SQuAD demo contexts, so
tests of byte-level tokenizers (add_prefix_space, missing pad tokens) run offline in milliseconds.

Usage: python scripts/make_tiny_bpe.py
"""
import gzip
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2TokenizerFast, RobertaTokenizerFast

RES = Path(__file__).resolve().parents[1] / "posbias" / "resources"
VOCAB = 2000


def texts():
    with gzip.open(RES / "squad_demo" / "train.json.gz", "rt", encoding="utf-8") as f:
        data = json.load(f)["data"]
    for article in data:
        for p in article["paragraphs"]:
            yield p["context"]
            for q in p["qas"]:
                yield q["question"]


def train(specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(), trainer)
    return tok


def main():
    roberta = train(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    roberta.post_processor = processors.RobertaProcessing(("</s>", roberta.token_to_id("</s>")),
                                                          ("<s>", roberta.token_to_id("<s>")), trim_offsets=True)
    fast = RobertaTokenizerFast(tokenizer_object=roberta, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    fast.save_pretrained(str(RES / "tiny_bpe_roberta"))
    gpt2 = train(["<|endoftext|>"])
    fast = GPT2TokenizerFast(tokenizer_object=gpt2, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                             unk_token="<|endoftext|>")
    fast.save_pretrained(str(RES / "tiny_bpe_gpt2"))


if __name__ == "__main__":
    main()
