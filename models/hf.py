"""The `hf` backend: response-token log-probs and batched generation with plain transformers.

    from capacity_advisor.models.loading import load_model
    from capacity_advisor.models.hf import HFBackend
    rows = HFBackend(load_model("lab:tiny")).score([("Q1+2=", "A3")], max_length=512)

Scoring never builds a (sequence x vocabulary) fp32 log-softmax: the decoder's last hidden states
are gathered at the positions that predict response tokens, and the LM head is applied to those
in chunks sized by `chunk_bytes`, each reduced to (target logit - logsumexp) at once. So a
16k-token trace with a 150k vocabulary costs one chunk of logits, not 16k x 150k x 4 bytes.
Pairs are sorted by length and packed into batches of at most `token_budget` padded tokens.
"""

from __future__ import annotations

from typing import Sequence

from capacity_advisor.models.backends import NEW_TOKENS, SCORE_LENGTH, Progress
from capacity_advisor.core.errors import InputError
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.models.template import Encoded, encode_pair, prompt_ids



# The default padded tokens per batch. On CPUs large batches lose: activations fall out of cache
# and the element-wise ops of the block slow down several-fold. benchmarks/scoring.py
# --budget-sweep measured hf/naive 1.12x at 1,024 against 0.82x at 8,192 (2 cores, 15M-param Llama).
CPU_TOKEN_BUDGET = 1024
GPU_TOKEN_BUDGET = 8192
# Generation on a CPU is the other way round: each new token is one small step per batch, whose
# fixed cost a larger batch shares (a 135M-parameter Llama decoded 113 tokens/s at 16 rows and
# 178 at 64, 2 cores). Used where no token budget is given.
CPU_GENERATE_BUDGET = 8192


class HFBackend:
    name = "hf"

    def __init__(self, lm: LoadedModel, token_budget: int | None = None, chunk_bytes: int = 256 << 20, max_batch: int = 256,
                 skip_tokens: int = 0):
        """`token_budget`: padded tokens per batch; None picks the device's default (above).
        `skip_tokens`: leave each response's first N tokens out of its score (a response-start cue
        such as "Okay," moves a whole response's likelihood without changing its reasoning)."""
        self.lm = lm
        self.skip_tokens = skip_tokens
        on_cpu = getattr(lm.device, "type", str(lm.device)) == "cpu"
        self.generate_budget = token_budget or (CPU_GENERATE_BUDGET if on_cpu else GPU_TOKEN_BUDGET)
        if token_budget is None:
            token_budget = CPU_TOKEN_BUDGET if on_cpu else GPU_TOKEN_BUDGET
        self.token_budget = token_budget
        self.chunk_bytes = chunk_bytes
        self.max_batch = max_batch

    # ---- scoring -------------------------------------------------------------------------
    def encode(self, pairs: Sequence[tuple[str, str]], max_length: int) -> list[Encoded]:
        return [encode_pair(self.lm.tokenizer, p, r, max_length) for p, r in pairs]

    def score(self, pairs: Sequence[tuple[str, str]], max_length: int = SCORE_LENGTH, progress: Progress | None = None) -> list[dict]:
        """Per pair: `score_row` (log-probs and ranks of the response's tokens)."""
        return self.score_encoded(self.encode(pairs, max_length), progress)

    def score_encoded(self, encoded: Sequence[Encoded], progress: Progress | None = None) -> list[dict]:
        import torch

        out: list[dict | None] = [None] * len(encoded)
        for idx in length_batches([len(e.input_ids) for e in encoded], self.token_budget, self.max_batch):
            batch = [encoded[i] for i in idx]
            with torch.inference_mode():
                sums = self._score_batch(batch)
            for i, e, (lp, rank, n) in zip(idx, batch, sums):
                out[i] = score_row(e, lp, rank, n, self.lm.tokenizer)
            if progress:
                progress(len(idx))
        return out  # type: ignore[return-value]

    def _score_batch(self, batch: Sequence[Encoded]) -> list[tuple[float, float, int]]:
        import torch

        model, dev = self.lm.model, self.lm.device
        pad = self.lm.tokenizer.pad_token_id or 0
        L = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), L), dtype=torch.long)
        rows, cols = [], []
        for b, e in enumerate(batch):
            n = len(e.input_ids)
            ids[b, :n] = torch.tensor(e.input_ids)
            mask[b, :n] = 1
            # position t predicts token t+1; response tokens are n_prompt .. n-1 (the first skip_tokens left out)
            pos = range(max(e.n_prompt - 1, 0) + self.skip_tokens, n - 1)
            rows.extend([b] * len(pos))
            cols.extend(pos)
        ids, mask = ids.to(dev), mask.to(dev)
        rows_t = torch.tensor(rows, dtype=torch.long, device=dev)
        cols_t = torch.tensor(cols, dtype=torch.long, device=dev)
        hidden = decoder_hidden(model, ids, mask)  # (B, L, H), right padding keeps positions exact
        h = hidden[rows_t, cols_t]  # (N, H)
        targets = ids[rows_t, cols_t + 1]
        logp, rank = token_logprobs(model, h, targets, self.chunk_bytes, ranks=True)
        sums = torch.zeros((3, len(batch)), dtype=torch.float64, device=dev)
        sums[0].index_add_(0, rows_t, logp.double())
        sums[1].index_add_(0, rows_t, rank.double())
        sums[2].index_add_(0, rows_t, torch.ones_like(logp, dtype=torch.float64))
        return [(lp, rk, int(n)) for lp, rk, n in zip(*sums.tolist())]

    # ---- generation ----------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = NEW_TOKENS,
        temperature: float = 0.0,
        n: int = 1,
        seed: int = 0,
        progress: Progress | None = None,
        top_p: float = 1.0,
        details: bool = False,
    ) -> list[list]:
        """n completions per prompt (greedy when temperature == 0), batched and KV-cached.

        With `details`, each completion is a dict of text, n_tokens and finished (it ended with
        EOS rather than at `max_new_tokens`)."""
        import torch

        if temperature == 0 and n > 1:
            raise InputError("greedy decoding (temperature 0) gives one completion per prompt; set a temperature > 0 for n > 1")
        tok, dev = self.lm.tokenizer, self.lm.device
        encoded = [prompt_ids(tok, p) for p in prompts]
        out: list[list] = [[] for _ in prompts]
        gen = torch.Generator(device="cpu").manual_seed(seed)
        budget = max(1, self.generate_budget // max(1, n))
        lengths = [len(e) + max_new_tokens for e in encoded]
        # Sampling reseeds the global generators per batch (seeded by `seed`, so the same call samples
        # the same text); fork_rng gives the caller's state back afterwards, so an evaluation in the
        # middle of training leaves its dropout and shuffling exactly as they would be without it.
        cuda = getattr(dev, "type", str(dev)).startswith("cuda")
        with torch.random.fork_rng(devices=[torch.device(dev).index or 0] if cuda else []):
            self._generate_batches(encoded, lengths, budget, gen, out, max_new_tokens, temperature, n, top_p,
                                   details, progress)
        return out

    def _generate_batches(self, encoded, lengths, budget, gen, out, max_new_tokens, temperature, n, top_p, details,
                          progress) -> None:
        import torch

        tok, model, dev = self.lm.tokenizer, self.lm.model, self.lm.device
        for idx in length_batches(lengths, budget, self.max_batch):
            L = max(len(encoded[i]) for i in idx)
            pad = tok.pad_token_id or 0
            ids = torch.full((len(idx), L), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), L), dtype=torch.long)
            for b, i in enumerate(idx):  # left padding, so every row continues from its last token
                e = encoded[i]
                ids[b, L - len(e):] = torch.tensor(e)
                mask[b, L - len(e):] = 1
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad, num_return_sequences=n)
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=top_p)
            else:
                kwargs.update(do_sample=False)
            with torch.inference_mode():
                seqs = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), **kwargs)
            new = seqs[:, L:]
            texts = tok.batch_decode(new, skip_special_tokens=True)
            if details:
                comps = [{"text": t, **_finished(row, tok.eos_token_id)} for t, row in zip(texts, new.tolist())]
            else:
                comps = texts
            for b, i in enumerate(idx):
                out[i] = comps[b * n:(b + 1) * n]
            if progress:
                progress(len(idx))


def _finished(row: list[int], eos: int | None) -> dict:
    """Tokens generated up to EOS, and whether EOS came (else the row hit max_new_tokens).

    Rows of a batch that stop early are filled with padding after their EOS, so only the part
    up to the first EOS counts."""
    if eos is not None and eos in row:
        return {"n_tokens": row.index(eos) + 1, "finished": True}
    return {"n_tokens": len(row), "finished": False}


def length_batches(lengths: Sequence[int], token_budget: int, max_batch: int) -> list[list[int]]:
    """Indices grouped longest-first so that rows x longest-length stays within the budget."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]
        if cur and ((len(cur) + 1) * width > token_budget or len(cur) >= max_batch):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def decoder_hidden(model, ids, mask):
    """Final hidden states (after the last norm) without computing any logits."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError):
        decoder = None
    if decoder is None:
        raise InputError(f"{type(model).__name__} does not expose its decoder; the hf scorer needs a standard causal LM")
    return decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def token_logprobs(model, hidden, targets, chunk_bytes: int, ranks: bool = False):
    """log p(target) for each row of `hidden`, applying the LM head a chunk of rows at a time;
    with `ranks`, also each target's rank among the vocabulary (1 = the most likely token)."""
    import torch

    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    cfg = model.config
    vocab = weight.shape[0]
    chunk = max(1, chunk_bytes // (vocab * (4 + weight.element_size())))
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    rank = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[0], chunk):
        logits = torch.nn.functional.linear(hidden[s:s + chunk], weight, bias).float()
        logits = _family_logit_transform(logits, cfg)
        tgt = logits.gather(1, targets[s:s + chunk, None])
        out[s:s + chunk] = tgt.squeeze(1) - torch.logsumexp(logits, dim=-1)
        if ranks:
            rank[s:s + chunk] = (logits > tgt).sum(dim=-1).float() + 1
    return (out, rank) if ranks else out


def score_row(e: Encoded, logprob_sum: float, rank_sum: float, n_scored: int, tokenizer) -> dict:
    """One scored response: `n_tokens` (its tokens), `n_scored` (those scored, after any skipped
    start), `logprob_sum`, `logprob_mean` (per scored token), `rank_mean` (mean rank of each token
    among the vocabulary), `first_tokens` (its first two tokens, decoded: the response-start cue),
    `truncated`. The one row layout of every backend."""
    nan = float("nan")
    first = e.input_ids[e.n_prompt:e.n_prompt + 2]
    return {"n_tokens": e.n_response, "n_scored": n_scored, "logprob_sum": float(logprob_sum),
            "logprob_mean": logprob_sum / n_scored if n_scored else nan,
            "rank_mean": rank_sum / n_scored if n_scored else nan,
            "first_tokens": tokenizer.decode(first) if first else "", "truncated": e.truncated}


def _family_logit_transform(logits, cfg):
    """The few model families whose forward rescales logits after the LM head (Cohere, Granite, Gemma 2/3)."""
    scale = getattr(cfg, "logit_scale", None)
    if scale is not None:
        logits = logits * scale
    divide = getattr(cfg, "logits_scaling", None)
    if divide:
        logits = logits / divide
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = cap * (logits / cap).tanh()
    return logits

