"""Caches and outputs that must not go stale or land where they should not: weight fingerprints by
whole content, files beside the scores of another run, the run key of a re-ranked run, outputs
that respect the umask, never write through a link, never replace an input, and hold no NaN."""

import json
import os
from pathlib import Path

import pytest

from capacity_advisor.core.errors import InputError


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_changed_middle_tensor_is_another_model(tmp_path, monkeypatch):
    """A weight file longer than 8 MiB whose middle byte changes keeps its size, head and tail:
    the fingerprint (and so the score cache key) must still change."""
    from capacity_advisor.models.loading import fingerprint

    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    weights = folder / "model.safetensors"
    weights.write_bytes(os.urandom(10 << 20))
    before = fingerprint(str(folder))
    assert fingerprint(str(folder)) == before  # remembered, and the same
    _flip_middle_byte(weights)
    assert fingerprint(str(folder)) != before


def test_the_remembered_digest_is_the_file_digest_and_follows_changes(tmp_path, monkeypatch):
    from capacity_advisor.core.files import cached_file_digest, file_digest

    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    assert cached_file_digest(f) == file_digest(f)
    assert len(list((tmp_path / "home" / "digests").iterdir())) == 1
    stat = f.stat()
    f.write_bytes(b"b" * 1000)
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: the change time still moves
    assert cached_file_digest(f) == file_digest(f)


def test_outputs_respect_the_umask_and_keep_an_existing_mode(tmp_path):
    from capacity_advisor.core.files import write_json, write_jsonl

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        write_jsonl(tmp_path / "b.jsonl", [{"x": 1}])
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        assert (tmp_path / "b.jsonl").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        write_json(tmp_path / "c.json", {})
        assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600
        os.chmod(tmp_path / "a.json", 0o640)
        write_json(tmp_path / "a.json", {"x": 2})  # a file replaced keeps its mode
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_an_output_never_writes_through_a_link(tmp_path):
    from capacity_advisor.core.files import write_json, write_text

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "out.json").symlink_to(victim)
    (tmp_path / "out.txt").symlink_to(victim)
    write_json(tmp_path / "out.json", {"x": 1})
    write_text(tmp_path / "out.txt", "new")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "out.json").is_symlink() and json.loads((tmp_path / "out.json").read_text()) == {"x": 1}


def test_refuse_overwrite_names_the_input(tmp_path):
    from capacity_advisor.core.files import refuse_overwrite

    pool = tmp_path / "pool.jsonl"
    pool.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(pool)
    os.link(pool, tmp_path / "hard.jsonl")
    folder = tmp_path / "dataset"
    folder.mkdir()
    for out in (pool, tmp_path / "link.jsonl", tmp_path / "hard.jsonl", tmp_path / "." / "pool.jsonl"):
        with pytest.raises(InputError, match="is the input"):
            refuse_overwrite([pool], [out])
    with pytest.raises(InputError, match="is the input"):
        refuse_overwrite([folder], [folder])  # recommend -p DIR -o DIR
    with pytest.raises(InputError, match="inside the input folder"):
        refuse_overwrite([folder], [folder / "train.jsonl"])
    refuse_overwrite([pool, None, "org/dataset"], [tmp_path / "train.jsonl", None])  # different paths pass
    refuse_overwrite([pool], [tmp_path / "pool.jsonl.config.json"])


def test_written_json_holds_no_nan(tmp_path):
    from capacity_advisor.core.files import write_json, write_jsonl

    write_json(tmp_path / "a.json", {"x": float("nan"), "y": [float("inf"), 1.5]})
    write_jsonl(tmp_path / "b.jsonl", [{"x": float("-inf")}])
    strict = lambda text: json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} written"))  # noqa: E731
    assert strict((tmp_path / "a.json").read_text()) == {"x": None, "y": [None, 1.5]}
    assert strict((tmp_path / "b.jsonl").read_text()) == {"x": None}


# ---- the score stage ---------------------------------------------------------------------------


def _pool(tmp_path):
    from capacity_advisor.advisor.pools.read import read_pool

    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"what is {i} + 1?", "answer": str(i + 1),
                                        "generations": [f"it is {i + 1}", f"so the answer is {i + 1}"]}) + "\n"
                            for i in range(3)))
    return read_pool(path)


def test_compute_file_of_other_scores_does_not_survive_a_rescore(tiny_llama, tiny_qwen, tmp_path):
    from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool

    pool, out = _pool(tmp_path), tmp_path / "score"
    score_pool(pool, ScoreConfig(model=tiny_llama, device="cpu"), out)
    (out / "compute.jsonl").write_text('{"id": "p0", "class": "solved"}\n')  # as `advisor score --compute-budgets` writes
    score_pool(pool, ScoreConfig(model=tiny_llama, device="cpu"), out)  # the same scores again: it stays
    assert (out / "compute.jsonl").exists()
    score_pool(pool, ScoreConfig(model=tiny_qwen, device="cpu"), out)  # another model
    assert not (out / "compute.jsonl").exists()


def test_skip_tokens_longer_than_the_responses_is_one_error_and_writes_nothing(tiny_llama, tmp_path):
    from capacity_advisor.advisor.scoring.score import ScoreConfig, score_pool

    pool, out = _pool(tmp_path), tmp_path / "score"
    with pytest.raises(InputError, match="--skip-tokens 500 leaves nothing to score"):
        score_pool(pool, ScoreConfig(model=tiny_llama, device="cpu", skip_tokens=500), out)
    assert not out.exists()
    summary = score_pool(pool, ScoreConfig(model=tiny_llama, device="cpu", skip_tokens=1), out)
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert summary["candidates"] == 6 and all(r["n_scored"] == r["n_tokens"] - 1 > 0 for r in rows)


# ---- the run key ---------------------------------------------------------------------------------


def test_the_rerank_candidates_file_is_part_of_the_run_key(tmp_path):
    from capacity_advisor.training.manifest import Manifest, TrainingSpec
    from capacity_advisor.training.run_check import run_key

    (tmp_path / "train.jsonl").write_text('{"id": "a", "prompt": "p", "completion": "c"}\n')
    (tmp_path / "cands.jsonl").write_text('{"id": "a", "prompt": "p", "responses": ["c", "d"]}\n')
    plain = Manifest(model={"spec": "lab:xs"}, dataset="train.jsonl", training=TrainingSpec(epochs=3), base_dir=str(tmp_path))
    m = Manifest(model={"spec": "lab:xs"}, dataset="train.jsonl", base_dir=str(tmp_path),
                 training=TrainingSpec(epochs=3, rerank={"epochs": [1], "candidates": "cands.jsonl", "score": "sum"}))
    before = run_key(m)
    (tmp_path / "cands.jsonl").write_text('{"id": "a", "prompt": "p", "responses": ["c", "e"]}\n')
    assert run_key(m) != before
    assert "candidates_digest" not in json.dumps(plain.to_dict())  # a run without re-ranking keeps its key


def test_generate_refuses_to_write_over_its_problems(tmp_path):
    from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool

    problems = tmp_path / "problems.jsonl"
    problems.write_text('{"problem": "1+1?", "answer": "2"}\n')
    with pytest.raises(InputError, match="is the input"):
        generate_pool(GenerateConfig(teacher="lab:xs", problems=str(problems), out=str(problems), n=1, temperature=0))
    assert problems.read_text() == '{"problem": "1+1?", "answer": "2"}\n'


def test_export_refuses_to_write_over_its_dataset(tmp_path):
    from capacity_advisor.training.export import export
    from capacity_advisor.training.manifest import Manifest

    (tmp_path / "train.jsonl").write_text('{"id": "a", "prompt": "p", "completion": "c", "k": 0}\n')
    m = Manifest(model={"spec": "org/not-here", "model_type": "llama"}, dataset="train.jsonl", base_dir=str(tmp_path))
    before = (tmp_path / "train.jsonl").read_text()
    with pytest.raises(InputError, match="is the input"):
        export(m, tmp_path, ("trl",))
    assert (tmp_path / "train.jsonl").read_text() == before and not (tmp_path / "trl_sft.py").exists()


def test_export_replaces_links_instead_of_writing_through_them(tmp_path):
    from capacity_advisor.training.export import export
    from capacity_advisor.training.manifest import Manifest

    (tmp_path / "train.jsonl").write_text('{"id": "a", "prompt": "p", "completion": "c"}\n')
    m = Manifest(model={"spec": "org/not-here", "model_type": "llama"}, dataset="train.jsonl", base_dir=str(tmp_path))
    out = tmp_path / "export"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    for name in ("trl_sft.py", "dataset_info.json", "llamafactory_sft.yaml", "axolotl_sft.yaml", "train.jsonl"):
        (out / name).symlink_to(victim)
    export(m, out)
    assert victim.read_text() == "keep me"
    assert not any(p.is_symlink() for p in out.iterdir())


def test_the_pool_fingerprint_hashed_a_problem_at_a_time_is_the_same_digest():
    from capacity_advisor.core.files import stable_hash, stable_hash_of_list

    for items in ([], [1], [["a", "é", [[0, "x"]]], {"b": 1, "a": [2.5, None]}], [[str(i), "p" * i] for i in range(40)]):
        assert stable_hash_of_list(iter(items)) == stable_hash(items)


def test_the_records_store_holds_no_nan(tmp_path):
    from capacity_advisor.training.record import append_line

    append_line(tmp_path / "records.jsonl", {"features": {"x": float("nan")}, "best_accuracy": float("inf")})
    row = json.loads((tmp_path / "records.jsonl").read_text(), parse_constant=lambda c: pytest.fail(f"{c} written"))
    assert row == {"features": {"x": None}, "best_accuracy": None}
