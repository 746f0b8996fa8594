"""Resumable, data-parallel work in fixed shards, each cached as one atomically written file.

    producer = {"model": ..., "pool": ...}      # everything the results depend on
    plan = ShardPlan(items, shard_size=512, cache=cache_folder("scores", producer), dp_rank=0, dp_size=1)
    plan.claim(producer)                        # records it in the folder; refuses another producer
    computed = plan.run(lambda i, shard: rows_of(shard))   # this rank's missing shards, each written atomically
    if plan.missing(): ...                      # other ranks still at work
    rows = plan.read(lambda rows, shard: ...)   # every shard's rows, checked against its items

`advisor score` and `advisor generate` both work this way: the loop, the resume and the check of
what a shard holds live here once.

Shards are cut in item order, so a shard's contents depend only on the items and the shard size:
a resumed run (or another rank) recomputes exactly what an uninterrupted one would have. A shard
file is named by the item range it holds (`shard-00000020-00000027.jsonl`), so runs with another
shard size never take each other's files for their own. Rank r of n owns the shards whose index
is r modulo n; every rank writes into the same cache folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import advisor_home, stable_hash, write_json, write_jsonl
from capacity_advisor.core.jsonl import read_jsonl

PRODUCER = "producer.json"


def cache_folder(kind: str, producer: dict) -> Path:
    """`$ADVISOR_HOME/<kind>/<hash of producer>`: one folder per distinct piece of work."""
    return advisor_home() / kind / stable_hash(producer)


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
        starts = range(0, len(self.items), self.shard_size)
        self.shards = [self.items[i:i + self.shard_size] for i in starts]
        self.paths = [Path(self.cache) / f"shard-{i:08d}-{i + len(s):08d}.jsonl" for i, s in zip(starts, self.shards)]
        self.mine = [i for i in range(len(self.shards)) if i % self.dp_size == self.dp_rank]

    def claim(self, producer: dict) -> None:
        """Record what fills this cache (JSON-plain values), or check it is what filled it before.

        The folder's name is a hash of `producer`, so a mismatch means a hand-copied folder, a
        collision or a stale layout; its shards would be wrong answers, so they are never used."""
        path = Path(self.cache) / PRODUCER
        if not path.exists():
            write_json(path, producer)
            return
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        if recorded != producer:
            differs = sorted(k for k in producer if not isinstance(recorded, dict) or recorded.get(k) != producer[k])
            raise InputError(f"cache folder {self.cache} was filled by another run (different {', '.join(differs)}); "
                             "delete that folder to compute afresh")

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

    def run(self, work: Callable[[int, Sequence], Iterable[dict]], stop_after: int | None = None) -> int | None:
        """Compute this rank's missing shards in order, `work(index, items)` giving each one's rows,
        and write each atomically as it finishes. Returns how many were computed, or None when
        `stop_after` shards were computed and others were left (tests of resume)."""
        computed = 0
        for i in self.todo():
            if stop_after is not None and computed >= stop_after:
                return None
            write_jsonl(self.paths[i], work(i, self.shards[i]))
            computed += 1
        return computed

    def read(self, matches: Callable[[list[dict], Sequence], bool]) -> list[list[dict]]:
        """Every shard's rows, in order. A shard that cannot be read or does not hold what its items
        say (`matches(rows, items)`) was damaged from outside (shards are written atomically): it is
        removed, so a rerun recomputes it, and the run stops with one InputError."""
        out = []
        for path, shard in zip(self.paths, self.shards):
            try:
                rows = read_jsonl(path)
            except ValueError:
                rows = None
            if rows is None or not matches(rows, shard):
                path.unlink()
                raise InputError(f"cached shard {path} was damaged and has been removed; rerun the same command to recompute it")
            out.append(rows)
        return out
