"""Resumable, data-parallel work in fixed shards, each cached as one atomically written file.

    plan = ShardPlan(items, shard_size=512, cache=advisor_home() / "scores" / key, dp_rank=0, dp_size=1)
    for i in plan.todo():
        write_jsonl(plan.paths[i], work(plan.shards[i]))
    if plan.missing(): ...   # other ranks still at work

Shards are cut in item order, so a shard's contents depend only on the items and the shard size:
a resumed run (or another rank) recomputes exactly what an uninterrupted one would have. Rank r
of n owns the shards whose index is r modulo n; every rank writes into the same cache folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


@dataclass
class ShardPlan:
    items: Sequence
    shard_size: int
    cache: Path
    dp_rank: int = 0
    dp_size: int = 1
    shards: list = field(init=False)
    paths: list[Path] = field(init=False)
    mine: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.shards = [self.items[i:i + self.shard_size] for i in range(0, len(self.items), self.shard_size)]
        self.paths = [Path(self.cache) / f"shard-{i:05d}.jsonl" for i in range(len(self.shards))]
        self.mine = [i for i in range(len(self.shards)) if i % self.dp_size == self.dp_rank]

    def my_items(self) -> int:
        return sum(len(self.shards[i]) for i in self.mine)

    def my_cached_items(self) -> int:
        return sum(len(self.shards[i]) for i in self.mine if self.paths[i].exists())

    def todo(self) -> list[int]:
        """This rank's shards not yet in the cache, in order."""
        return [i for i in self.mine if not self.paths[i].exists()]

    def missing(self) -> list[int]:
        """Every shard (any rank's) not yet in the cache."""
        return [i for i, p in enumerate(self.paths) if not p.exists()]
