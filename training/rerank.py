"""Re-ranking as training goes: the candidates are scored again under the current checkpoint at
chosen epochs, and each problem's response is chosen again by the same rule.

    "training": {..., "rerank": {"epochs": [2, 4], "candidates": "candidates.jsonl", "score": "sum"}}

What is "high-" or "low-likelihood" for a student moves as it trains (the useful band of data
drifts), so the set chosen from the base student's scores may not be the set its later self
would choose. At the start of each listed epoch, rank 0 scores every candidate with the weights
being trained (the hf backend, the same rendering as `advisor score`), picks each problem's
response by the manifest's strategy (high, low, or mixed with its share and seed) under
`score`, writes the choice and its scores to RUN/rerank/epoch-E.jsonl, and every rank swaps the
training rows in place. A resumed run reads that file instead of scoring again. The tokens spent
scoring are counted, so a comparison with the static selection can be made at equal compute.

`candidates.jsonl` holds one row per training problem: `id` (as in the dataset rows), `prompt`,
`responses` (the candidates that may be chosen); `advisor select --candidates` writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import unpaired_surrogate, write_jsonl
from capacity_advisor.core.jsonl import read_jsonl
from capacity_advisor.models.backends import make_backend
from capacity_advisor.models.loading import LoadedModel
from capacity_advisor.training.ranking import extremes, low_share, score_value


def read_candidates(path: str | Path, dataset_ids: set[str]) -> list[dict]:
    try:
        rows = read_jsonl(path)
    except (OSError, ValueError) as e:
        raise InputError(f"training.rerank.candidates: {e}") from None
    for i, r in enumerate(rows, 1):
        if not (isinstance(r.get("prompt"), str) and isinstance(r.get("responses"), list) and len(r["responses"]) >= 1
                and all(isinstance(x, str) for x in r["responses"]) and r.get("id") is not None):
            raise InputError(f"training.rerank.candidates {path} row {i}: needs id, a string prompt and a list of responses")
        if any(unpaired_surrogate(x) is not None for x in (r["prompt"], *r["responses"])):
            raise InputError(f"training.rerank.candidates {path} row {i}: a text holds an unpaired surrogate escape "
                             "(\\ud800-\\udfff alone); fix that escape in the file")
    missing = dataset_ids - {str(r["id"]) for r in rows}
    if missing:
        raise InputError(f"training.rerank.candidates {path} lacks {len(missing)} of the dataset's problems "
                         f"(first: {sorted(missing)[0]!r}); write it with the dataset (`advisor select --candidates`)")
    return rows


def choose(candidates: list[dict], scores: list[list[dict]], strategy: str, mix: float, score: str, seed: int) -> list[int]:
    """Each problem's chosen candidate index: argmax (high) or argmin (low) of the ranking, or for
    mixed a share `mix` of the problems (drawn with `seed`, as `advisor select` draws them) on argmin."""
    ids = [str(c["id"]) for c in candidates]
    low_ids = low_share(ids, mix, seed) if strategy == "mixed" else set()
    out = []
    for pid, rows in zip(ids, scores):
        hi, lo = extremes({k: score_value(r, score) for k, r in enumerate(rows)})
        out.append(lo if strategy == "low" or pid in low_ids else hi)
    return out


class RerankCallback(TrainerCallback):
    """Re-scores and re-chooses the training rows at the listed epochs (see the module doc)."""

    def __init__(self, run_dir: Path, dataset, candidates: list[dict], epochs, strategy: str, mix: float, score: str,
                 seed: int, tokenizer, max_length: int, spec: str):
        self.run_dir = Path(run_dir)
        self.dataset = dataset
        self.candidates = candidates
        self.epochs = {int(e) for e in epochs}
        self.strategy, self.mix, self.score, self.seed = strategy, mix, score, seed
        self.tokenizer, self.max_length, self.spec = tokenizer, max_length, spec
        self.trainer = None  # set by the runner: needed for the FSDP full-parameter view
        self.tokens = 0

    def on_epoch_begin(self, args, state, control, model=None, **kw):
        from capacity_advisor.training.callbacks import full_params, barrier, gather_to_main, rank

        epoch = int((state.epoch or 0) + 1e-6)
        if epoch not in self.epochs:
            return
        path = self.run_dir / "rerank" / f"epoch-{epoch}.jsonl"
        # rank 0's view decides for all: gathering FSDP's shards is a collective every rank enters
        if gather_to_main(not path.exists() if rank() == 0 else None)[0]:
            was_training = model.training
            model.eval()
            try:
                with full_params(self.trainer):
                    if rank() == 0:
                        self._rescore(model, args.device, path)
            finally:
                if was_training:
                    model.train()
        barrier()
        chosen = {str(r["id"]): r for r in read_jsonl(path)}
        rows = self.dataset.phases["all"]
        for row in rows:
            c = chosen[str(row["id"])]
            row["completion"], row["k"] = c["response"], c["k"]

    def _rescore(self, model, device, path: Path) -> None:
        backend = make_backend("hf", LoadedModel(model, self.tokenizer, device, self.spec, None, {}))
        pairs = [(c["prompt"], r) for c in self.candidates for r in c["responses"]]
        encoded = backend.encode(pairs, self.max_length)
        flat = backend.score_encoded(encoded)
        self.tokens += sum(len(e.input_ids) for e in encoded)
        scores, i = [], 0
        for c in self.candidates:
            scores.append(flat[i:i + len(c["responses"])])
            i += len(c["responses"])
        picks = choose(self.candidates, scores, self.strategy, self.mix, self.score, self.seed)
        write_jsonl(path, ({"id": c["id"], "k": k, "response": c["responses"][k],
                            "scores": [{key: s[key] for key in ("logprob_sum", "logprob_mean", "rank_mean")} for s in sc]}
                           for c, k, sc in zip(self.candidates, picks, scores)))


def describe(path: Path) -> dict:
    """How many problems changed their response at each re-ranking (for the record)."""
    out = {}
    previous = None
    for f in sorted(Path(path).glob("epoch-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        ks = {str(json.loads(line)["id"]): json.loads(line)["k"] for line in f.read_text().splitlines() if line.strip()}
        out[f.stem] = {"problems": len(ks), "changed_since_previous": None if previous is None else
                       sum(ks[i] != previous.get(i) for i in ks)}
        previous = ks
    return out
