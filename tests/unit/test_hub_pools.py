"""Pools named by a hub dataset id, or read from a dataset repository folder laid out as the hub lays it out."""

import socket
import time

import pytest

from capacity_advisor.advisor.pools.options import PoolOptions
from capacity_advisor.advisor.pools.read import read_pool
from capacity_advisor.core.errors import InputError

README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: default/train-*.parquet
  - split: test
    path: default/test-*.parquet
- config_name: extended
  data_files:
  - split: train
    path: extended/train-*.parquet
---
# a dataset card
"""


def rows(tag: str, n: int) -> list[dict]:
    return [{"uuid": f"{tag}-{i}", "problem": f"{tag} problem {i}", "answer": str(i),
             "generations": [f"so \\\\boxed{{{i}}}", f"we get {i}, \\\\boxed{{{i}}}"],
             "correctness_math_verify": [True, True]} for i in range(n)]


@pytest.fixture
def repo(tmp_path):
    """A dataset repository as `hf download --repo-type dataset` leaves it: a card and Parquet shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "OpenR1-like"
    for config, split, n in (("default", "train", 5), ("default", "test", 3), ("extended", "train", 7)):
        (root / config).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows(f"{config}-{split}", n)), root / config / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text(README)
    return root


def test_a_dataset_repository_folder_reads_by_split_and_subset(repo, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    pool = read_pool(repo)
    assert len(pool) == 5 and pool.layout == "grouped" and pool.problems[0].id == "default-train-0"
    assert [p.id for p in read_pool(repo, PoolOptions(split="test")).problems] == ["default-test-0", "default-test-1",
                                                                                  "default-test-2"]
    assert len(read_pool(repo, PoolOptions(subset="extended"))) == 7
    with pytest.raises(InputError, match="validation"):
        read_pool(repo, PoolOptions(split="validation"))
    with pytest.raises(InputError, match="nosuch"):
        read_pool(repo, PoolOptions(subset="nosuch"))


def test_the_cli_takes_dataset_flags(repo, tmp_path, monkeypatch, tiny_llama):
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    r = CliRunner().invoke(cli, ["score", "-m", tiny_llama, "-p", str(repo), "--subset", "extended", "-o",
                                 str(tmp_path / "s"), "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.stderr
    assert '"candidates": 14' in r.stdout


def test_a_hub_id_without_the_hub_is_one_line_at_once(monkeypatch, tmp_path):
    import datasets
    from huggingface_hub import constants

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)  # restored after the test
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE)
    # at once: no retries (a connection or two, no waits between them), counted rather than timed
    connects, waits = [], []
    connect, sleep = socket.socket.connect, time.sleep
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: connects.append(address) or connect(self, address))
    monkeypatch.setattr(time, "sleep", lambda seconds: waits.append(seconds) or sleep(seconds))
    with pytest.raises(InputError) as e:
        read_pool("someorg/some-dataset", PoolOptions(split="train"))
    assert 1 <= len(connects) <= 2 and not waits, (connects, waits)
    msg = str(e.value)
    assert "someorg/some-dataset" in msg and "hf download someorg/some-dataset --repo-type dataset" in msg and "\n" not in msg
