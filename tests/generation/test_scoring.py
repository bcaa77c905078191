"""posbias/generation/scoring.py: the answer's log-likelihood equals a hand computation, whatever the
batch and its padding; greedy answers are what the model decodes alone."""
import numpy as np
import pytest
import torch

from posbias.generation.scoring import (Encoded, answer_logprobs, encode_prompts, first_line, generate_answers,
                                        left_pad, length_batches, squad_scores)
from tests.generation.tiny import gemma, llama, tokenizer

PROMPTS = ["Document [1](Title: Paris) The Eiffel Tower stands in Paris.\n\nQuestion: Where is the tower?\nAnswer:",
           "Question: Who wrote Hamlet?\nAnswer:",
           "A much longer prompt, " * 12 + "\nQuestion: Which river flows through it?\nAnswer:"]
ANSWERS = ["Paris", "William Shakespeare", "the Seine"]


def hand_logprob(model, e: Encoded) -> float:
    """Mean log-probability of the answer tokens, one unpadded sequence, in float64."""
    ids = torch.tensor([e.prompt + e.answer])
    logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    return float(np.mean([logp[len(e.prompt) - 1 + j, t].item() for j, t in enumerate(e.answer)]))


@pytest.mark.parametrize("build", [gemma, llama])
def test_log_likelihood_equals_a_hand_computation_in_padded_batches(build):
    tok = tokenizer()
    model = build(tok, dtype=torch.float64)
    enc = encode_prompts(tok, PROMPTS, ANSWERS)
    assert len({len(e.prompt) for e in enc}) == 3  # different lengths: the batch is padded
    got = answer_logprobs(model, enc, pad_id=tok.pad_token_id, device="cpu", batch_size=3)
    want = np.array([hand_logprob(model, e) for e in enc])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())
    # one at a time gives the same
    alone = np.concatenate([answer_logprobs(model, [e], pad_id=tok.pad_token_id, device="cpu") for e in enc])
    np.testing.assert_allclose(alone, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_a_wrong_offset_would_be_caught():
    """The hand computation tells the answer's logits from their neighbours'."""
    tok = tokenizer()
    model = gemma(tok, dtype=torch.float64)
    e = encode_prompts(tok, PROMPTS[:1], ANSWERS[:1])[0]
    shifted = Encoded(e.prompt[:-1], [e.prompt[-1]] + e.answer[:-1])
    assert abs(hand_logprob(model, e) - answer_logprobs(model, [shifted], pad_id=tok.pad_token_id, device="cpu")[0]) > 1e-6


def test_the_answer_is_tokenized_after_a_space():
    tok = tokenizer()
    e = encode_prompts(tok, ["Answer:"], ["Paris"])[0]
    assert e.answer == tok(" Paris", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="no tokens"):
        encode_prompts(tok, ["Answer:"], [" "])


def test_left_padding_counts_positions_from_the_first_real_token():
    ids, mask, pos = left_pad([[5, 6, 7], [8]], 0, "cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_length_batches_cover_every_prompt_once_within_the_limits():
    lengths = [5, 100, 7, 50, 50, 3, 200]
    batches = length_batches(lengths, batch_size=2, max_tokens=120)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 2
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 120
    assert batches[0] == [6]  # the longest first, alone over the token budget


def test_greedy_answers_in_a_batch_equal_those_decoded_alone():
    tok = tokenizer()
    model = llama(tok)
    enc = encode_prompts(tok, PROMPTS, ANSWERS)
    batch = generate_answers(model, tok, enc, pad_id=tok.pad_token_id, device="cpu", batch_size=3, max_new_tokens=6)
    alone = [generate_answers(model, tok, [e], pad_id=tok.pad_token_id, device="cpu", max_new_tokens=6)[0]
             for e in enc]
    assert batch == alone
    assert all("\n" not in a for a in batch)


def test_first_line_and_squad_scores():
    assert first_line("\n  Gustave Eiffel\nQuestion: ...") == "Gustave Eiffel"
    assert first_line("   ") == ""
    assert squad_scores("the Seine", ["Seine", "River Seine"]) == (100.0, 100.0)
    em, f1 = squad_scores("the river Seine in Paris", ["River Seine"])
    assert em == 0.0 and f1 == pytest.approx(100 * 2 * (2 / 4) * 1 / (2 / 4 + 1))
