"""The hf scorer against a direct one-example-at-a-time computation, on two architectures."""

import pytest
import torch

from capacity_advisor.models.hf import HFBackend, length_batches, token_logprobs
from capacity_advisor.models.loading import load_model
from capacity_advisor.models.template import encode_pair
from helpers import PAIRS

def reference(lm, prompt, response, max_length=4096):
    """Full forward, full fp32 log-softmax, one example at a time."""
    e = encode_pair(lm.tokenizer, prompt, response, max_length)
    ids = torch.tensor([e.input_ids])
    with torch.no_grad():
        logp = lm.model(ids).logits.float().log_softmax(-1)[0]
    tgt = ids[0, e.n_prompt:]
    vals = logp[e.n_prompt - 1:-1].gather(1, tgt[:, None]).squeeze(1)
    return vals.sum().item(), len(tgt)


@pytest.fixture(params=["tiny_llama", "tiny_qwen"])
def lm(request):
    return load_model(request.getfixturevalue(request.param), device="cpu")


def test_scores_match_reference(lm):
    rows = HFBackend(lm).score(PAIRS)
    for (p, r), row in zip(PAIRS, rows):
        ref_sum, n = reference(lm, p, r)
        assert row["n_tokens"] == n > 0
        assert abs(row["logprob_sum"] - ref_sum) < 1e-4 * max(1, n)
        assert abs(row["logprob_mean"] - ref_sum / n) < 1e-4
        assert row["truncated"] is False


def test_batched_equals_unbatched(lm):
    batched = HFBackend(lm, token_budget=100_000).score(PAIRS)
    single = HFBackend(lm, token_budget=1).score(PAIRS)  # budget below any length: one pair per batch
    tiny_chunks = HFBackend(lm, chunk_bytes=1).score(PAIRS)  # one logit row per chunk
    for a, b, c in zip(batched, single, tiny_chunks):
        assert abs(a["logprob_sum"] - b["logprob_sum"]) < 1e-4
        assert abs(a["logprob_sum"] - c["logprob_sum"]) < 1e-4
        assert a["n_tokens"] == b["n_tokens"] == c["n_tokens"]


def test_chat_template_is_used_only_when_present(tiny_llama, tiny_qwen):
    llama, qwen = load_model(tiny_llama, device="cpu"), load_model(tiny_qwen, device="cpu")
    e = encode_pair(qwen.tokenizer, "hi", "there", 512)
    assert "<|im_start|>assistant" in qwen.tokenizer.decode(e.input_ids[: e.n_prompt])
    e = encode_pair(llama.tokenizer, "hi", "there", 512)
    assert e.input_ids[0] == llama.tokenizer.bos_token_id
    assert llama.tokenizer.decode(e.input_ids[e.n_prompt:]) == "there"


def test_truncation_is_flagged_and_scores_the_kept_tokens(tiny_llama):
    lm = load_model(tiny_llama, device="cpu")
    prompt, response = PAIRS[1]
    full = encode_pair(lm.tokenizer, prompt, response, 4096)
    row = HFBackend(lm).score([(prompt, response)], max_length=20)[0]
    assert row["truncated"] is True and row["n_tokens"] == 20 - full.n_prompt
    ref_sum, _ = reference(lm, prompt, response, max_length=20)
    assert abs(row["logprob_sum"] - ref_sum) < 1e-4
    # a prompt longer than half the budget keeps its first token and its end
    e = encode_pair(lm.tokenizer, "word " * 50, "ok fine", 16)
    assert len(e.input_ids) <= 16 and e.input_ids[0] == lm.tokenizer.bos_token_id and e.n_response >= 1


def test_chunked_logprobs_do_not_need_a_full_softmax():
    """The head is applied in chunks; a 3-row chunk budget gives the same numbers as one big one."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 1000, bias=False)
    model = type("M", (), {"get_output_embeddings": lambda self: head, "config": type("C", (), {})()})()
    h = torch.randn(50, 8)
    t = torch.randint(0, 1000, (50,))
    full = head(h).log_softmax(-1).gather(1, t[:, None]).squeeze(1)
    small = token_logprobs(model, h, t, chunk_bytes=3 * 1000 * 8)
    assert torch.allclose(full, small, atol=1e-5)


def test_length_batches_respect_budget():
    lengths = [5, 50, 7, 50, 20, 1]
    batches = length_batches(lengths, token_budget=100, max_batch=8)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 100 or len(b) == 1


def test_generate_is_deterministic_greedy(tiny_llama):
    from capacity_advisor.models.hf import HFBackend

    lm = load_model(tiny_llama, device="cpu")
    be = HFBackend(lm)
    a = be.generate(["what is", "Let us think step"], max_new_tokens=6)
    b = be.generate(["Let us think step"], max_new_tokens=6)
    assert len(a) == 2 and all(len(x) == 1 for x in a)
    assert a[1] == b[0]  # left padding in a batch does not change a greedy continuation


def test_ranks_skipped_tokens_and_response_starts_match_a_direct_computation(lm):
    """rank_mean, --skip-tokens and first_tokens on hand-checked pairs (a full softmax, one pair at a time)."""
    plain, skipped = HFBackend(lm).score(PAIRS), HFBackend(lm, skip_tokens=2).score(PAIRS)
    for (p, r), row, srow in zip(PAIRS, plain, skipped):
        e = encode_pair(lm.tokenizer, p, r, 4096)
        ids = torch.tensor([e.input_ids])
        with torch.no_grad():
            logits = lm.model(ids).logits.float()[0]
        pos = torch.arange(e.n_prompt - 1, len(e.input_ids) - 1)
        tgt = ids[0, e.n_prompt:]
        lp = logits[pos].log_softmax(-1).gather(1, tgt[:, None]).squeeze(1)
        ranks = (logits[pos] > logits[pos].gather(1, tgt[:, None])).sum(-1).float() + 1
        assert row["rank_mean"] == pytest.approx(ranks.mean().item(), rel=1e-5)
        assert row["first_tokens"] == lm.tokenizer.decode(e.input_ids[e.n_prompt:e.n_prompt + 2])
        kept = max(0, len(tgt) - 2)
        assert srow["n_tokens"] == row["n_tokens"] and srow["n_scored"] == kept
        if kept:
            assert srow["logprob_sum"] == pytest.approx(lp[2:].sum().item(), abs=1e-4 * kept)
            assert srow["rank_mean"] == pytest.approx(ranks[2:].mean().item(), rel=1e-5)
        else:
            assert srow["logprob_sum"] == 0 and srow["logprob_mean"] != srow["logprob_mean"]  # NaN


def test_step_local_scores_equal_a_direct_computation(lab_home):
    """LALP on a lab response: each step's mean token log-prob given only `window` tokens before it, averaged."""
    from capacity_advisor.models.local import local_logprobs, step_spans

    lm = load_model("lab:xs", device="cpu")
    prompt, response = "C3+4*9-2=", "|3+4=7,7*9=3,3-2=1;A1"
    assert [response[a:b] for a, b in step_spans(response)] == ["|3+4=7,", "7*9=3,", "3-2=1;", "A1"]
    assert [("a\nb\n")[a:b] for a, b in step_spans("a\nb\n")] == ["a\n", "b\n"]
    window = 5
    got = local_logprobs(HFBackend(lm), lm.tokenizer, [(prompt, response)], 96, window)[0]
    tok = lm.tokenizer
    prompt_ids = tok(prompt)["input_ids"]
    steps, means = ["|3+4=7,", "7*9=3,", "3-2=1;", "A1"], []
    before = list(prompt_ids)
    for step in steps:
        ids = tok(step, add_special_tokens=False)["input_ids"]
        ctx = before[-window:]
        x = torch.tensor([[tok.bos_token_id] + ctx + ids])
        with torch.no_grad():
            logp = lm.model(x).logits.float().log_softmax(-1)[0]
        n0 = 1 + len(ctx)
        vals = logp[n0 - 1:-1].gather(1, x[0, n0:, None]).squeeze(1)
        means.append(vals.mean().item())
        before += ids
    assert got == pytest.approx(sum(means) / len(means), abs=1e-5)
