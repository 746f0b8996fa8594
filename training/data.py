"""Training rows and the completion-only collator.

The dataset is TRL prompt/completion JSONL (`advisor select --format trl`). Each batch is
tokenized by `models.template.collate` — the same rule `advisor score` uses, plus EOS — so
the tokens trained on are exactly the tokens that were scored, and labels are -100 on the prompt
and padding (completion-only loss).

Curriculum sets carry `phase` = high | low on every row, with the same problems in each phase.
With `switch_epoch`, the dataset serves the high rows in epochs before it and the low rows after;
`CurriculumCallback` tells it which epoch the trainer is in (also after a resume).
"""

from __future__ import annotations

from pathlib import Path

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import unpaired_surrogate
from capacity_advisor.core.jsonl import read_jsonl_input
from capacity_advisor.models.template import collate


def read_sft_rows(path: str | Path) -> list[dict]:
    """Rows with string `prompt` and `completion` (plus whatever else they carry)."""
    rows = read_jsonl_input(path)
    if not rows:
        raise InputError(f"dataset {path} has no rows: select a non-empty training set")
    for i, r in enumerate(rows, 1):
        if "completion" not in r and isinstance(r.get("response"), str):
            r["completion"] = r["response"]
        if not isinstance(r.get("prompt"), str) or not isinstance(r.get("completion"), str):
            raise InputError(f"dataset {path} row {i}: needs string fields 'prompt' and 'completion' "
                             "(TRL prompt/completion JSONL, as `advisor select --format trl` writes)")
        if unpaired_surrogate(r["prompt"]) is not None or unpaired_surrogate(r["completion"]) is not None:
            raise InputError(f"dataset {path} row {i}: a text holds an unpaired surrogate escape (\\ud800-\\udfff "
                             "alone); fix that escape in the file")
    return rows


def read_eval_set(path: str | Path, limit: int | None) -> list[dict]:
    """The held-out rows: string `prompt`, optional `answer`, optional `references` (teacher responses)."""
    rows = read_jsonl_input(path)
    rows = rows[:limit] if limit else rows
    for i, r in enumerate(rows, 1):
        if not isinstance(r.get("prompt"), str):
            raise InputError(f"eval set {path} row {i}: needs a string 'prompt' (and 'answer' for accuracy)")
        if r.get("answer") is not None:
            r["answer"] = str(r["answer"])
        refs = r.get("references")
        if refs is not None and not (isinstance(refs, dict) and all(
                isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)) for v in refs.values())):
            raise InputError(f"eval set {path} row {i}: 'references' must map a kind to a response or a list of responses")
    if not rows:
        raise InputError(f"eval set {path} has no rows")
    return rows


class SFTDataset:
    """Map-style dataset of {"prompt", "completion"}; curriculum-aware (see module doc)."""

    def __init__(self, rows: list[dict], switch_epoch: float | None = None, where: str = "dataset"):
        self.switch_epoch = switch_epoch
        self.epoch = 0
        if switch_epoch is None:
            self.phases = {"all": rows}
            return
        high = [r for r in rows if r.get("phase") == "high"]
        low = [r for r in rows if r.get("phase") == "low"]
        if not high or not low or len(high) != len(low):
            raise InputError(f"{where}: training.switch_epoch needs a curriculum set (`advisor select --strategy curriculum`): "
                             f"rows with phase high and phase low in equal numbers, got {len(high)} high and {len(low)} low")
        self.phases = {"high": high, "low": low}

    @property
    def phase(self) -> str:
        """Epoch e (0-based) covers [e, e+1): high while e < switch_epoch, so a fractional switch
        takes effect at the next whole epoch."""
        if self.switch_epoch is None:
            return "all"
        return "high" if self.epoch < self.switch_epoch else "low"

    def __len__(self) -> int:
        return len(next(iter(self.phases.values())))

    def __getitem__(self, i: int) -> dict:
        r = self.phases[self.phase][i]
        return {"prompt": r["prompt"], "completion": r["completion"]}


class CompletionCollator:
    """Pads a batch; labels cover the response and its EOS only. Counts the tokens it served."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.tokens = 0

    def __call__(self, features: list[dict]) -> dict:
        ids, mask, labels = collate(self.tokenizer, [(f["prompt"], f["completion"]) for f in features],
                                    self.max_length, completion_only=True, add_eos=True)
        self.tokens += int(mask.sum())
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
