"""The options of reading a pool: field overrides and filtering rules (`PoolOptions`).

Its own module, below `advisor.pools.read` (which reads a pool with them) and `advisor.pools.layout`
(which detects a layout under them), so that neither of the two imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity_advisor.advisor.pools.files import DatasetSource


@dataclass
class PoolOptions:
    """Field overrides and filtering rules; each field is also a CLI flag of the same name."""

    prompt_field: str | None = None  # --prompt-field: the problem text
    responses_field: str | None = None  # --responses-field: list of candidates (grouped) or one response (flat)
    answer_field: str | None = None  # --answer-field: reference answer, for accuracy
    correct_field: str | None = None  # --correct-field: correctness marks, list or per row
    id_field: str | None = None  # --id-field: problem id (flat rows are grouped by it)
    all_candidates: bool = False  # --all-candidates: keep candidates marked incorrect
    strict: bool = False  # --strict: any skipped candidate or problem is an error
    split: str | None = None  # --split: of a hub dataset or dataset folder (default: train, or its only split)
    subset: str | None = None  # --subset: the dataset's configuration name
    revision: str | None = None  # --revision: a hub dataset's branch, tag or commit
    min_candidates: int = 2

    @property
    def source(self) -> "DatasetSource":
        return DatasetSource(self.split, self.subset, self.revision)
