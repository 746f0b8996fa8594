"""Files a user may be handed, and a new user's slips: each ends in exactly one `error:` line and exit
code 2, with nothing half-written, or in the documented behaviour. Calibration folders for `lab
report`, mistyped pool paths, dataset folders that point outside themselves, chat templates that
fail on some prompts only, crafted model folders, score files and manifests of the wrong shape."""

import gc
import json
import shutil
import weakref
from pathlib import Path

import pytest
from helpers import one_error_line, read_jsonl, run, write_jsonl

from capacity_advisor.core.errors import InputError


# ---- advisor lab report on a damaged calibration folder -----------------------------------------


def _calibration(root: Path) -> Path:
    cal = root / "cal"
    for strategy, slope in (("high", 0.04), ("low", 0.06)):
        run_dir = cal / "modchain" / "sum" / "xs-s0" / strategy
        run_dir.mkdir(parents=True)
        (run_dir / "record.json").write_text(json.dumps({"version": 1, "strategy": strategy}))
        rows = [{"step": s, "epoch": s / 4, "accuracy": 0.1 + slope * s, "repetition_rate": 0.0,
                 "teacher_view": 2.0 - 0.1 * s} for s in range(9)]
        write_jsonl(run_dir / "eval.jsonl", rows)
    return cal


def _rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "eval.jsonl")


def _write_rows(run_dir: Path, rows: list[dict]) -> None:
    write_jsonl(run_dir / "eval.jsonl", rows)


def _damage(name: str, cal: Path) -> None:
    low = cal / "modchain" / "sum" / "xs-s0" / "low"
    rows = _rows(low)
    if name == "damaged line":
        (low / "eval.jsonl").write_text((low / "eval.jsonl").read_text() + '{"epoch": 3, \n')
    elif name == "missing":
        (low / "eval.jsonl").unlink()
    elif name == "not utf-8":
        (low / "eval.jsonl").write_bytes(b'{"epoch": 0, "accuracy": 0.1, "x": "\xff\xfe"}\n')
    elif name == "deeply nested":
        (low / "eval.jsonl").write_text('{"epoch": 0, "accuracy": 0.1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    elif name == "no epoch":
        rows[3].pop("epoch")
        _write_rows(low, rows)
    elif name == "accuracy null":
        rows[3]["accuracy"] = None
        _write_rows(low, rows)
    elif name == "epoch a string":
        rows[3]["epoch"] = "0.75"
        _write_rows(low, rows)
    elif name == "student not in the ladder":
        shutil.move(str(cal / "modchain" / "sum" / "xs-s0"), str(cal / "modchain" / "sum" / "huge-s0"))
    elif name == "only epoch 0":
        _write_rows(low, rows[:1])
    elif name == "empty eval.jsonl":
        (low / "eval.jsonl").write_text("")
    elif name == "record.json not JSON":
        (low / "record.json").write_text("{not json")


DAMAGE = {"damaged line": "not valid JSON", "missing": "is missing", "not utf-8": "not valid UTF-8",
          "deeply nested": "nested too deeply", "no epoch": "epoch None", "accuracy null": "accuracy None",
          "epoch a string": "epoch '0.75'", "student not in the ladder": "not a lab student",
          "only epoch 0": "only the base model", "empty eval.jsonl": "is empty", "record.json not JSON": "record.json"}


def test_lab_report_of_a_good_folder_writes_its_outputs(tmp_path):
    cal, out = _calibration(tmp_path), tmp_path / "report"
    r = run("lab", "report", cal, "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["curves-modchain-sum.png", "results.json", "results.md"]
    assert json.loads(r.stdout)[0]["summary"]["low_ahead_at_end"] is True


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_lab_report_on_a_damaged_folder_is_one_error_line(tmp_path, damage):
    cal, out = _calibration(tmp_path), tmp_path / "report"
    _damage(damage, cal)
    one_error_line(run("lab", "report", cal, "-o", out), DAMAGE[damage], out)


# ---- pool paths, dataset folders ----------------------------------------------------------------


def test_a_mistyped_local_path_is_no_such_file_not_a_hub_id(tmp_path, monkeypatch):
    from capacity_advisor.advisor.pools.files import looks_like_file
    from capacity_advisor.advisor.pools.read import read_pool

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for given in ("data/pool200.jsonlx", "pool200.jsonlx", "data/pool200"):
        with pytest.raises(InputError, match="no such file") as e:
            read_pool(given)
        assert "hub" not in str(e.value).split(":")[0].lower() and "Hub" not in str(e.value)
    assert not looks_like_file("open-r1/OpenR1-Math-220k") and not looks_like_file("AI-MO/NuminaMath-1.5")


def test_a_mistyped_pool_is_one_error_line_in_the_cli(tmp_path, tiny_llama, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    one_error_line(run("score", "-m", tiny_llama, "-p", "data/pool200.jsonlx", "-o", tmp_path / "out"),
                   "no such file", tmp_path / "out")


def _repository_folder(root: Path, readme: str) -> Path:
    folder = root / "ds"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.jsonl").write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    (folder / "README.md").write_text(readme)
    return folder


@pytest.mark.parametrize("data_files", ["/etc/hostname", "../outside.jsonl", "data/../../outside.jsonl",
                                        "~/outside.jsonl", "hf://datasets/org/name/x.jsonl"])
def test_a_dataset_card_naming_files_outside_its_folder_is_refused(tmp_path, data_files):
    from capacity_advisor.advisor.pools.read import read_pool

    (tmp_path / "outside.jsonl").write_text('{"problem": "secret?", "generations": ["a", "b"]}\n')
    readme = f"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: {data_files}\n---\n# x\n"
    with pytest.raises(InputError, match="outside the folder"):
        read_pool(_repository_folder(tmp_path, readme))


def test_a_dataset_folder_with_a_link_leading_out_is_refused(tmp_path):
    from capacity_advisor.advisor.pools.read import read_pool

    (tmp_path / "outside.jsonl").write_text('{"problem": "secret?", "generations": ["a", "b"]}\n')
    folder = _repository_folder(tmp_path, "---\nconfigs:\n- config_name: default\n  data_files: data/*.jsonl\n---\n")
    (folder / "data" / "more.jsonl").symlink_to(tmp_path / "outside.jsonl")
    with pytest.raises(InputError, match="outside the folder"):
        read_pool(folder)
    (folder / "data" / "more.jsonl").unlink()
    assert len(read_pool(folder)) == 1  # inside the folder: read as before


def test_a_saved_dataset_naming_files_outside_is_refused(tmp_path):
    import datasets

    from capacity_advisor.advisor.pools.read import read_pool

    folder = tmp_path / "saved"
    datasets.Dataset.from_list([{"problem": "1+1?", "generations": ["2", "two"]}]).save_to_disk(str(folder))
    state = json.loads((folder / "state.json").read_text())
    elsewhere = tmp_path / "elsewhere.arrow"
    shutil.copy(folder / state["_data_files"][0]["filename"], elsewhere)
    state["_data_files"][0]["filename"] = str(elsewhere)
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(InputError, match="outside the folder"):
        read_pool(folder)


def test_split_is_honoured_for_a_saved_dataset_dict(tmp_path):
    import datasets

    from capacity_advisor.advisor.pools.options import PoolOptions
    from capacity_advisor.advisor.pools.read import read_pool

    folder = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"problem": f"train {i}?", "generations": ["a", "b"]} for i in range(3)]),
        "test": datasets.Dataset.from_list([{"problem": "test?", "generations": ["a", "b"]}]),
    }).save_to_disk(str(folder))
    assert len(read_pool(folder)) == 3
    assert [p.prompt for p in read_pool(folder, PoolOptions(split="test")).problems] == ["test?"]
    with pytest.raises(InputError, match="no split 'valid'"):
        read_pool(folder, PoolOptions(split="valid"))


# ---- --sample while reading ------------------------------------------------------------------


def _big_pool(path: Path, n: int, flat: bool = False) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            gens = [f"answer {i} way {k}" for k in range(3)] + ([""] if i % 7 == 0 else [])
            marks = [bool(k != 1 or i % 5) for k in range(len(gens))]
            if flat:
                for g, c in zip(gens, marks):
                    f.write(json.dumps({"prompt": f"problem {i % (n - 3)}", "response": g, "correct": c}) + "\n")
            else:
                row = {"problem": f"problem {i}", "generations": gens, "correctness": marks}
                if i % 3:
                    row["id"] = str(i + 1) if i % 11 else f"p{i}"  # some ids collide with stand-in row numbers
                f.write(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize("flat", [False, True])
def test_sampling_while_reading_equals_sampling_the_read_pool(tmp_path, flat):
    import random

    from capacity_advisor.advisor.pools.read import Pool, read_pool

    path = _big_pool(tmp_path / "pool.jsonl", 300, flat)
    whole = read_pool(path)
    keep = set(random.Random(7).sample([p.id for p in whole.problems], 25))
    expected = Pool([p for p in whole.problems if p.id in keep], whole.source, whole.layout, whole.fields, whole.n_rows,
                    whole.skipped_candidates, whole.skipped_problems, whole.skipped_examples)
    got = read_pool(path, sample=25, seed=7)
    assert got.summary() == expected.summary() and got.fingerprint() == expected.fingerprint()
    assert [(p.id, p.prompt, [(c.k, c.text) for c in p.candidates]) for p in got.problems] == \
        [(p.id, p.prompt, [(c.k, c.text) for c in p.candidates]) for p in expected.problems]
    assert read_pool(path, sample=10_000).summary() == whole.summary()


def test_sampling_holds_only_the_drawn_problems_text(tmp_path, monkeypatch):
    import capacity_advisor.advisor.pools.read as pool_mod

    path = _big_pool(tmp_path / "pool.jsonl", 400)
    made = []
    real = pool_mod.Candidate

    def counting(*args, **kw):
        c = real(*args, **kw)
        made.append(weakref.ref(c))
        return c

    monkeypatch.setattr(pool_mod, "Candidate", counting)
    pool = pool_mod.read_pool(path, sample=10)
    assert len(pool) == 10
    # The first pass judges each row's candidates and keeps only their emptiness and marks; the second
    # builds the drawn problems' alone. What stays alive is their text.
    gc.collect()
    alive = [r for r in made if r() is not None]
    assert len(made) > 400 and len(alive) == sum(len(p.candidates) for p in pool.problems) <= 4 * 10


# ---- chat templates that fail on some prompts only --------------------------------------------


LOOPS_ON_SOME = ("{% if 'LOOP' in messages[0]['content'] %}{% for i in range(100000) %}{% for j in range(100000) %}"
                 "{% endfor %}{% endfor %}{% endif %}<|im_start|>user\n{{ messages[0]['content'] }}<|im_end|>\n"
                 "<|im_start|>assistant\n")
BALLOONS_ON_SOME = ("{% if 'HUGE' in messages[0]['content'] %}{% for i in range(100000) %}{% for j in range(100000) %}"
                    "{{ messages[0]['content'] * 50 }}{% endfor %}{% endfor %}{% endif %}<|im_start|>user\n"
                    "{{ messages[0]['content'] }}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template,word", [(LOOPS_ON_SOME, "LOOP"), (BALLOONS_ON_SOME, "HUGE")])
def test_a_template_failing_on_some_pool_prompts_stops_score_in_one_line(tiny_qwen, tmp_path, monkeypatch, template, word):
    monkeypatch.setattr("capacity_advisor.models.template.TEMPLATE_SECONDS", 1.0)
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen, folder)
    (folder / "chat_template.jinja").write_text(template)
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": str(i), "problem": f"question {i}" + (f" {word}" if i == 3 else ""),
                                        "generations": ["a b", "c d"]}) + "\n" for i in range(5)))
    one_error_line(run("score", "-m", folder, "-p", pool, "-o", tmp_path / "out"), "chat template", tmp_path / "out")


def test_a_template_failing_on_a_training_prompt_stops_the_export(tiny_qwen, tmp_path, monkeypatch):
    from capacity_advisor.training.manifest import Manifest

    monkeypatch.setattr("capacity_advisor.models.template.TEMPLATE_SECONDS", 1.0)
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen, folder)
    (folder / "chat_template.jinja").write_text(LOOPS_ON_SOME)
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "train.jsonl").write_text('{"prompt": "fine", "completion": "x"}\n{"prompt": "a LOOP", "completion": "y"}\n')
    Manifest(model={"spec": str(folder)}, dataset="train.jsonl").to_json(tmp_path / "rec" / "recommendation.json")
    one_error_line(run("train", tmp_path / "rec" / "recommendation.json", "--export", tmp_path / "export"),
                   "chat template", tmp_path / "export")


# ---- crafted model folders ---------------------------------------------------------------------


def _craft(name: str, folder: Path) -> None:
    import struct

    if name == "safetensors header":
        p = folder / "model.safetensors"
        p.write_bytes(struct.pack("<Q", 10 ** 12) + p.read_bytes()[8:])
    elif name == "tokenizer.json":
        (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 5}}')
    elif name == "generation_config strings":
        (folder / "generation_config.json").write_text(json.dumps({"max_length": "20", "temperature": "hot"}))
    elif name == "generation_config string limit":
        (folder / "generation_config.json").write_text(json.dumps({"max_new_tokens": "20", "do_sample": "yes"}))


@pytest.mark.parametrize("name", ["safetensors header", "tokenizer.json", "generation_config strings",
                                  "generation_config string limit"])
def test_crafted_model_folders_are_one_error_line(tiny_llama, tmp_path, name):
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    _craft(name, folder)
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"problem": "1+1?", "generations": ["2", "two"]}\n')
    one_error_line(run("score", "-m", folder, "-p", pool, "-o", tmp_path / "out"), str(folder), tmp_path / "out")


# ---- select on score files of the wrong shape, and onto its own inputs -------------------------


def _scored(tmp_path, **fields):
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"id": "a", "problem": "1+1?", "generations": ["2", "two"]}\n')
    rows = [{"id": "a", "k": k, "n_tokens": 2, "n_scored": 2, "logprob_sum": -1.0 - k, "logprob_mean": -0.5 - k,
             "rank_mean": 2.0, "truncated": False, "logprob_local": -0.3, **fields} for k in range(2)]
    return pool, write_jsonl(tmp_path / "scores.jsonl", rows)


@pytest.mark.parametrize("score,fields,fragment", [
    ("rsr", {"rank_mean": "2"}, "rank_mean '2', not a number"),
    ("rsr", {"rank_mean": None}, "needs token ranks"),
    ("rsr", {"logprob_mean": -0.5, "rank_mean": [1]}, "rank_mean [1]"),
    ("local", {"logprob_local": "high"}, "logprob_local 'high'"),
    ("local", {"logprob_local": None}, "needs step-local scores"),
])
def test_select_on_mistyped_ranking_fields_is_one_error_line(tmp_path, score, fields, fragment):
    pool, scores = _scored(tmp_path, **fields)
    out = tmp_path / "train.jsonl"
    one_error_line(run("select", "-p", pool, "-s", scores, "--score", score, "-o", out), fragment, out)


def test_select_does_not_write_over_its_pool_or_scores(tmp_path):
    pool, scores = _scored(tmp_path)
    before = pool.read_text(), scores.read_text()
    for out in (pool, scores):
        one_error_line(run("select", "-p", pool, "-s", scores, "-o", out), "is the input")
    assert (pool.read_text(), scores.read_text()) == before
    assert not (tmp_path / "pool.config.json").exists() and not (tmp_path / "scores.config.json").exists()


# ---- manifests -----------------------------------------------------------------------------------


def _manifest(folder: Path, **training) -> Path:
    from capacity_advisor.training.manifest import Manifest, TrainingSpec

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps({"id": str(i), "prompt": f"C{i}+1=", "completion": f"A{i + 1}"})
                                                + "\n" for i in range(8)))
    m = Manifest(model={"spec": "lab:xs"}, dataset="train.jsonl",
                 training=TrainingSpec(**{"epochs": 1, "batch_size": 4, "learning_rate": 1e-3, **training}))
    path = folder / "recommendation.json"
    path.write_text(json.dumps(m.to_dict()))
    return path


@pytest.mark.parametrize("seed", [-1, 2 ** 64, 2 ** 32])
def test_seeds_numpy_and_torch_cannot_take_are_refused(tmp_path, seed):
    path = _manifest(tmp_path / "rec")
    d = json.loads(path.read_text())
    d["training"]["seed"] = seed
    path.write_text(json.dumps(d))
    for extra in (["--dry-run"], []):
        one_error_line(run("train", path, "-o", tmp_path / "run", *extra), "training.seed", tmp_path / "run")


def test_an_advice_only_manifest_says_so(tmp_path):
    path = tmp_path / "recommendation.json"
    path.write_text(json.dumps({"version": 1, "advice_only": True, "strategy": "high", "answer": "D_high",
                                "probabilities": {"high": 0.8}, "dataset": None, "next": "rerun with --pool"}))
    for args in (["-o", tmp_path / "run"], ["--export", tmp_path / "run"]):
        one_error_line(run("train", path, *args), "this manifest holds advice only (", tmp_path / "run")


@pytest.mark.parametrize("case,fragment", [
    ("batch over processes", "x processes (3)"),
    ("run folder of another manifest", "holds a run of another manifest"),
    ("curriculum without phases", "training.switch_epoch needs a curriculum set"),
    ("candidates missing a problem", "of the dataset's problems"),
    ("epochs override before the switch", "--epochs 1.0 on manifest"),
])
def test_dry_run_refuses_what_the_run_refuses(tmp_path, lab_home, case, fragment):
    args, training = [], {}
    if case == "batch over processes":
        args = ["--nproc", "3"]
    elif case == "curriculum without phases":
        training = {"epochs": 2, "switch_epoch": 1}
    elif case == "candidates missing a problem":
        training = {"epochs": 2, "rerank": {"epochs": [1], "candidates": "cands.jsonl", "score": "sum"}}
    elif case == "epochs override before the switch":
        training, args = {"epochs": 3, "switch_epoch": 2}, ["--epochs", "1"]
    path = _manifest(tmp_path / "rec", **training)
    if case == "candidates missing a problem":
        (tmp_path / "rec" / "cands.jsonl").write_text('{"id": "0", "prompt": "C0+1=", "responses": ["A1", "A1 "]}\n')
    out = tmp_path / "run"
    if case == "run folder of another manifest":
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"run_key": "0123456789abcdef"}))
    for extra in (["--dry-run"], []):
        r = run("train", path, "-o", out, *args, *extra)
        one_error_line(r, fragment)
        assert not (out / "eval.jsonl").exists()


def test_max_steps_and_epochs_override_the_manifest(tmp_path, lab_home):
    path = _manifest(tmp_path / "rec", epochs=3)
    r = run("train", path, "-o", tmp_path / "dry", "--max-steps", "2", "--epochs", "2", "--dry-run")
    assert r.exit_code == 0 and "--epochs 2.0 --max-steps 2" in r.stderr, r.stderr
    r = run("train", path, "-o", tmp_path / "run", "--max-steps", "2", "--json")
    assert r.exit_code == 0, r.stderr
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["settings"]["max_steps"] == 2 and record["epochs"] == 3 and record["evals"][-1]["step"] == 2
    r = run("train", path, "-o", tmp_path / "run", "--max-steps", "3")  # another run: its folder is not reused
    one_error_line(r, "holds a run of another manifest")


# ---- exports ---------------------------------------------------------------------------------------


def test_axolotl_runs_without_telemetry_and_trl_uses_the_current_checkpointing_key(tmp_path, tiny_llama, monkeypatch):
    import runpy

    from capacity_advisor.training.export import export
    from capacity_advisor.training.manifest import load_manifest

    path = _manifest(tmp_path / "rec", gradient_checkpointing=True)
    d = json.loads(path.read_text())
    d["model"] = {"spec": tiny_llama}
    path.write_text(json.dumps(d))
    out = tmp_path / "export"
    export(load_manifest(path), out)
    launch = (out / "axolotl_train.sh").read_text()
    assert "export AXOLOTL_DO_NOT_TRACK=1" in launch and "axolotl_sft.yaml" in launch
    assert "AXOLOTL_DO_NOT_TRACK=1" in (out / "axolotl_sft.yaml").read_text().splitlines()[0]
    monkeypatch.chdir(tmp_path)
    settings = runpy.run_path(str(out / "trl_sft.py"))["SETTINGS"]
    assert settings["activation_checkpointing"] is True and "gradient_checkpointing" not in settings


# ---- the new user's path ---------------------------------------------------------------------------


def test_math_verify_is_a_dependency_and_the_checker_says_so():
    from importlib.metadata import requires

    from capacity_advisor.training.text_metrics import check_answer, math_checker_name

    assert any(r.replace("_", "-").startswith("math-verify") for r in requires("capacity-advisor"))
    assert math_checker_name() == "math-verify"
    assert check_answer("so the answer is $\\frac{1}{2}$", "0.5", "math")  # equal values, not equal strings


def test_plain_progress_lines_when_stderr_is_not_a_terminal():
    import io

    from capacity_advisor.advisor.cli.ui import PlainProgress

    stream = io.StringIO()
    report = PlainProgress("pretraining xs", every=3600, stream=stream)
    for step in range(1, 101):
        report(step, 100, 1.0 / step)
    assert stream.getvalue().splitlines() == ["pretraining xs: 1/100 steps, loss 1.000",
                                              "pretraining xs: 100/100 steps, loss 0.010"]
