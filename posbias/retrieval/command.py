"""`posbias diagnose retrieval`: its place on the command line. Retrieval is a diagnosis, not a
training task (`posbias.tasks.Task`): an embedding model ranking passages; it is registered in
`posbias.registry.DIAGNOSES` with its whole sub-parser and its `diagnose`, which
`posbias.diagnose(..., task="retrieval")` (and so the CLI) calls."""
from __future__ import annotations

from .. import arguments as cli_args
from ..diagnoses import run
from ..registry import DIAGNOSES


class RetrievalDiagnosis:
    name = "retrieval"
    cli_help = "sentence-embedding retrievers ranking passages"
    cli_commands = ("diagnose",)

    def add_cli_arguments(self, command: str, p) -> None:
        """`posbias diagnose retrieval`'s arguments, all of them (it has no config to override)."""
        cli_args.model_arg(p, "sentence-transformers folder, plain Hugging Face encoder folder (mean pooling), "
                              "`minilm` or a cached Hub id")
        p.add_argument("--data", required=True, help="SQuAD JSON(.gz) or MRQA JSONL(.gz): questions with located "
                                                      "answers")
        p.add_argument("--output-dir", required=True, help="diagnosis.md/.html/.json, ranks.json and plots go here")
        p.add_argument("--no-bm25", dest="bm25", action="store_false", help="leave out the BM25 baseline")
        p.add_argument("--no-chunks", dest="chunks", action="store_false",
                       help="leave out best-chunk (max-sim) scoring")
        p.add_argument("--chunk-tokens", type=cli_args.positive_int, default=128,
                       help="tokens per chunk for max-sim (default 128)")
        p.add_argument("--no-paired", dest="paired", action="store_false",
                       help="leave out the paired start/middle/end documents")
        p.add_argument("--max-length", type=cli_args.positive_int, default=None,
                       help="tokens the model reads per text (default: the model's own, e.g. max_seq_length)")
        p.add_argument("--batch-size", type=cli_args.positive_int, default=64,
                       help="texts per forward batch (default 64)")
        p.add_argument("--max-queries", type=cli_args.positive_int, default=None,
                       help="the first N questions of the file only")
        p.add_argument("--cache-dir", type=cli_args.folder, default=None,
                       help="keep embeddings here (safetensors) for the next run")
        p.add_argument("--seed", type=cli_args.integer, default=0, help="the paired variant's filler order (default 0)")
        cli_args.verdict_args(p, "questions")
        p.add_argument("--device", default="auto", help=cli_args.DEVICE_HELP)
        p.add_argument("--precision", default="auto", choices=cli_args.PRECISIONS,
                       help="auto (default): bf16 where the hardware computes it natively, else fp32")
        cli_args.task_options(p, "bm25", "chunks", "chunk_tokens", "paired", "max_length", "batch_size",
                              "max_queries", "cache_dir", "seed", "device", "precision")


    def diagnose(self, model, data, output_dir, *, progress: bool = True, bootstrap_samples: int = 2000,
                 min_bucket: int = 30, quality_floor: float = 20.0, **options) -> dict:
        """`posbias.diagnose_retrieval`; what `posbias.diagnose(..., task="retrieval")` runs."""
        return diagnose_retrieval(model, data, output_dir, progress=progress, bootstrap_samples=bootstrap_samples,
                                  min_bucket=min_bucket, quality_floor=quality_floor, **options)


def diagnose_retrieval(model, data, output_dir, *, progress: bool = True, bootstrap_samples: int = 2000,
                       min_bucket: int = 30, quality_floor: float = 20.0, **options) -> dict:
    """Position bias of a sentence-embedding model (`posbias diagnose retrieval`; `posbias.retrieval`).

    Every answerable question of the SQuAD-format `data` is ranked against all its passages:
    NDCG@10, recall@k and MRR by where the answer sits (SQuAD-PosQ's character buckets, and
    tokens), front − rear and PSI with bootstrap intervals, BM25 and best-chunk (max-sim) scoring
    beside it, and the paired variant (each paragraph at the start, middle and end of a document).

    Args:
        model: a sentence-transformers folder, a plain Hugging Face encoder folder (mean pooling),
            `minilm`, a cached Hub id, or an object with `posbias.retrieval.embed.Embedder`'s members.
        data: SQuAD JSON or MRQA JSONL with located answers.
        output_dir: where diagnosis.md, .html, .json, ranks.json and the plots are written.
        progress: show progress.
        bootstrap_samples: resamples for the intervals (0: point values only).
        min_bucket: fewest questions a position bucket needs to stand alone.
        quality_floor: overall score (points) under which the report warns.
        **options: device, precision (auto: bf16 where the hardware has it), max_length,
            batch_size, bm25, chunks, chunk_tokens, paired, seed, max_queries, cache_dir
            (embeddings reused across runs); see `posbias.retrieval.diagnose.diagnose`.

    Returns:
        The diagnosis as written to diagnosis.json, with the `verdict_lines` that
        `posbias diagnose retrieval` prints.
    """
    from .diagnose import diagnose as _diagnose  # loads torch: `import posbias` stays light

    return run(_diagnose, model, data, output_dir, progress=progress, bootstrap_samples=bootstrap_samples,
               min_bucket=min_bucket, quality_floor=quality_floor, **options)


DIAGNOSES.register("retrieval")(RetrievalDiagnosis())
