"""Special files where a verb reads or keeps a regular one (a FIFO, a folder, a device), and a
damaged D_low: each one `error:` line at once, before a model is loaded, naming the file."""

import os

import pytest
from helpers import make_manifest, no_loading, one_error_line, race_manifest, run, tear


def test_a_fifo_folder_or_device_where_a_run_keeps_a_file_is_one_error_line_at_once(tmp_path, monkeypatch):
    no_loading(monkeypatch)
    plain = make_manifest(tmp_path / "rec", "lab:s")
    raced = race_manifest(tmp_path / "race-rec", "lab:s")
    cases = [("config.json", os.mkfifo, []), ("config.json", os.mkfifo, ["--race", 0.5]),
             ("eval.jsonl", os.mkfifo, []), ("record.json", os.mkdir, []), ("race.json", os.mkfifo, ["--race", 0.5]),
             ("config.json", lambda p: os.symlink("/dev/zero", p), [])]
    for i, (name, make, more) in enumerate(cases):
        out = tmp_path / f"out{i}"
        out.mkdir()
        make(out / name)
        line = one_error_line(run("train", raced if more else plain, "--out", out, *more), f"{out / name} is a")
        assert "pass a new --out" in line
        assert sorted(p.name for p in out.iterdir()) == [name]
    fifo = tmp_path / "records.jsonl"
    os.mkfifo(fifo)
    one_error_line(run("train", plain, "--out", tmp_path / "o", "--records", fifo), "is a FIFO, not a regular file",
                   tmp_path / "o")


@pytest.mark.parametrize("damage, words", [
    ("torn", "line 16: not valid JSON"), ("fields", "row 3: needs string fields"), ("utf-8", "not valid UTF-8"),
    ("empty", "has no rows"), ("fifo", "is a FIFO, not a file"), ("folder", "is a folder, not a file"),
])
def test_a_damaged_d_low_is_refused_before_a_model_is_loaded(tmp_path, tiny_llama, monkeypatch, damage, words):
    no_loading(monkeypatch)
    path = race_manifest(tmp_path / "rec", tiny_llama)
    low = tmp_path / "rec" / "train-low.jsonl"
    rows = low.read_text().splitlines()
    if damage == "torn":
        tear(low)
    elif damage == "fields":
        low.write_text("\n".join(rows[:2] + ['{"prompt": "x", "response": 3}'] + rows[3:]) + "\n")
    elif damage == "utf-8":
        low.write_bytes(low.read_bytes()[:-30] + b"\xff\xfe}\n")
    elif damage == "empty":
        low.write_text("")
    else:
        low.unlink()
        (os.mkfifo if damage == "fifo" else os.mkdir)(low)
    out = tmp_path / "out"
    line = one_error_line(run("train", path, "--out", out, "--race", 0.5), words, out)
    assert "train-low.jsonl" in line


@pytest.mark.parametrize("args, words", [
    (["train", "<fifo>", "-o", "<out>"], "fifo is a FIFO: pass the recommendation.json"),
    (["fit", "-r", "<fifo>", "-o", "<out>"], "fifo is a FIFO, not a regular file"),
    (["select", "-p", "<pool>", "-s", "<pool>", "-o", "<out>/s.jsonl"], "pool.jsonl is a FIFO, not a regular file"),
    (["score", "-m", "lab:xs", "-p", "<zero>", "-o", "<out>"], "zero.jsonl is a device or socket, not a regular file"),
    (["recommend", "-m", "lab:xs", "-b", 1, "-p", "<pool>", "-o", "<out>"], "pool.jsonl is a FIFO, not a regular file"),
    (["train", "<manifest>", "-o", "<out>", "--nproc", 2, "--launcher", "accelerate", "--accelerate-config", "<fifo>"],
     "fifo is a FIFO, not a config file"),
    (["lab", "pool", "--n", 10 ** 14, "--out", "<out>/p.jsonl"], "--n must be from 1 to 1,000,000 problems"),
])
def test_a_special_file_where_a_verb_reads_a_file_or_a_count_past_any_use_is_one_error_line(tmp_path, monkeypatch,
                                                                                              args, words):
    no_loading(monkeypatch)
    names = {"<fifo>": tmp_path / "fifo", "<pool>": tmp_path / "pool.jsonl", "<zero>": tmp_path / "zero.jsonl",
             "<manifest>": make_manifest(tmp_path / "rec", "lab:s"), "<out>": tmp_path / "out"}
    os.mkfifo(names["<fifo>"])
    os.mkfifo(names["<pool>"])
    os.symlink("/dev/zero", names["<zero>"])
    for key, path in names.items():
        args = [str(a).replace(key, str(path)) for a in args]
    one_error_line(run(*args), words, tmp_path / "out")
