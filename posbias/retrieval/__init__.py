"""Position bias of retrievers: `posbias diagnose retrieval` for any sentence-embedding model.

Zeng et al. (2025, "An Empirical Study of Position Bias in Modern Information Retrieval", first as
"Benchmarking the Myopic Trap") show that single-vector embedding models rank a passage lower when the
text that answers the query sits late in it, while BM25 and cross-encoders do not. This package
measures it on a user's model and SQuAD-format data:

- `benchmark.py`: the benchmarks. SQuAD-PosQ's construction (every question against the corpus of all
  passages, bucketed by where its answer starts in its gold passage), and a paired variant where only
  the position moves: the answer's paragraph placed at the start, middle or end of a document padded
  with sentences of other paragraphs of the same article, every question scored at every position.
- `embed.py`: a sentence-transformers folder (its own pooling and normalisation), a plain Hugging
  Face encoder (mean pooling), `minilm` or a Hub id; embeddings in length-sorted batches, bf16 where
  the hardware has it, cached per model and texts (safetensors).
- `metrics.py`: the gold passage's rank (ties at their expected rank) -> NDCG@10, recall@k, MRR.
- `bm25.py`: the lexical baseline.
- `diagnose.py`: the diagnosis and its report (the verdict first, as the QA and tagging diagnoses).
"""
