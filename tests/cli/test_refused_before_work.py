"""A bad input is refused before any work: one `error:` line and exit code 2, found before the
scoring pass, the model's load or the run's first step, with nothing written and no library's
bars or notes around it; the numbers a manifest or a race holds are bounded by what can run; no
output is written over another output or an input; what would be a silent wrong result is refused."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HANG_S, no_loading, one_error_line, race_manifest, resign, run, write_jsonl


def manifest(folder: Path, spec: str, **training) -> Path:
    from capacity_advisor.training.manifest import Manifest, TrainingSpec

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text('{"prompt": "what is 1 + 2?", "completion": "3"}\n' * 4)
    m = Manifest(model={"spec": spec}, dataset="train.jsonl", training=TrainingSpec(**training))
    path = folder / "recommendation.json"
    path.write_text(json.dumps(m.to_dict()))
    return path


# ---- every rendering of a chat template is bounded ----------------------------------------

LOOPS_ON_X = ("{% if messages[0]['content'] == 'x' %}{% for i in range(100000) %}{% for j in range(100000) %}"
              "{% endfor %}{% endfor %}{% endif %}<|im_start|>user\n{{ messages[0]['content'] }}<|im_end|>\n"
              "<|im_start|>assistant\n")


def test_a_template_looping_on_the_export_probe_stops_the_llamafactory_export(tiny_qwen, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen, folder)
    (folder / "chat_template.jinja").write_text(LOOPS_ON_X)
    path = manifest(tmp_path / "rec", str(folder))
    code = ("import sys; import capacity_advisor.models.template as t; t.TEMPLATE_SECONDS = 1.0; "
            "from capacity_advisor.advisor.cli.main import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", code, "train", str(path), "--export", str(tmp_path / "export"),
                        "--format", "llamafactory"], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "chat template" in lines[0], p.stderr
    assert not (tmp_path / "export").exists()


# ---- the manifest's numbers are bounded by what can run -----------------------------------

@pytest.mark.parametrize("field", ["batch_size", "max_length", "grad_accum", "evals_per_epoch", "max_steps"])
def test_dry_run_refuses_numbers_no_run_can_take(tmp_path, field):
    path = manifest(tmp_path / "rec", "lab:xs")
    m = json.loads(path.read_text())
    m["training"][field] = 10 ** 20
    path.write_text(json.dumps(m))
    one_error_line(run("train", path, "--out", tmp_path / "run", "--dry-run"), f"training.{field}", tmp_path / "run")


def test_eval_numbers_are_bounded_too(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    m = json.loads(path.read_text())
    m["eval"]["max_new_tokens"] = 10 ** 20
    path.write_text(json.dumps(m))
    one_error_line(run("train", path, "--out", tmp_path / "run", "--dry-run"), "eval.max_new_tokens")


# ---- no tracebacks ----------------------------------------------------------------------

def test_negative_threads_is_a_usage_line(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    one_error_line(run("train", path, "--out", tmp_path / "run", "--threads", "-1"), "--threads", tmp_path / "run")


# ---- errors found before the scoring pass, not after it ---------------------------------

def plain_pool(path: Path, answers: bool = True, n: int = 4) -> Path:
    rows = [{"id": f"q{i}", "problem": f"what is {i} + 1?", "generations": [f"it is {i + 1}", f"{i + 1} it is"],
             **({"answer": str(i + 1)} if answers else {})} for i in range(n)]
    return write_jsonl(path, rows)


def test_compute_budgets_on_a_pool_without_answers_is_refused_before_scoring(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr("capacity_advisor.advisor.scoring.score.load_for", lambda cfg: pytest.fail("loaded the model"))
    pool = plain_pool(tmp_path / "pool.jsonl", answers=False)
    out = tmp_path / "out"
    one_error_line(run("score", "-m", tiny_llama, "-p", pool, "-o", out, "--compute-budgets", "8,16"),
                   "reference answers", out)


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_out_a_broken_link_is_refused_before_scoring(tiny_llama, tmp_path, monkeypatch, link):
    monkeypatch.setattr("capacity_advisor.advisor.scoring.score.load_for", lambda cfg: pytest.fail("loaded the model"))
    out = tmp_path / "out"
    if link == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    else:
        out.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(out)
    line = one_error_line(run("score", "-m", tiny_llama, "-p", plain_pool(tmp_path / "pool.jsonl"), "-o", out),
                          "symbolic link")
    assert "--out" in line and not (tmp_path / "nowhere").exists()


def _predictor_without(folder: Path, tmp_path: Path, change) -> Path:
    body = json.loads((folder / "predictor.json").read_text())
    change(body)
    out = tmp_path / "predictor"
    out.mkdir()
    (out / "predictor.json").write_text(json.dumps(resign(body)))
    return out


SHIPPED = Path(__file__).resolve().parents[2] / "advisor" / "predictor_data"


def test_recommend_without_a_lab_prior_is_refused_before_scoring(lab_home, tmp_path):
    pool = tmp_path / "labpool.jsonl"
    assert run("lab", "pool", "--n", 40, "--out", pool).exit_code == 0
    pred = _predictor_without(SHIPPED, tmp_path, lambda body: body["meta"].pop("lab_prior"))
    out = tmp_path / "rec"
    one_error_line(run("recommend", "-m", "lab:xs", "-b", 2, "--pool", pool, "--predictor", pred, "--no-probe",
                       "-o", out, "--device", "cpu"), "no lab prior", out)


def test_a_lab_prior_of_overflowing_coefficients_is_refused_at_load(tmp_path):
    def blow(body):
        body["meta"]["lab_prior"]["member"]["coef"] = [[1e308] * 3] * 3

    pred = _predictor_without(SHIPPED, tmp_path, blow)
    out = tmp_path / "rec"
    one_error_line(run("recommend", "-m", "lab:xs", "-b", 2, "--predictor", pred, "--no-probe", "-o", out),
                   "lab_prior", out)


def test_a_predictor_listing_an_endless_curriculum_is_refused(tmp_path):
    pred = _predictor_without(SHIPPED, tmp_path, lambda body: body["options"].append("curriculum@1e309"))
    out = tmp_path / "rec"
    one_error_line(run("recommend", "-m", "lab:xs", "-b", 2, "--predictor", pred, "--no-probe", "-o", out),
                   "options", out)


# ---- no output replaces another output, or an input ---------------------------------------

def select_inputs(tmp_path: Path, n: int = 4) -> tuple[Path, Path]:
    """A pool and its scores, made without --skip-tokens (every response token scored)."""
    pool = plain_pool(tmp_path / "pool.jsonl", n=n)
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps({"id": f"q{i}", "k": k, "n_tokens": 3, "n_scored": 3, "logprob_sum": -1.0 - k - i,
                                          "logprob_mean": -0.3 - k, "truncated": False}) + "\n"
                              for i in range(n) for k in range(2)))
    return pool, scores


def test_select_refuses_candidates_written_over_the_dataset(tmp_path):
    pool, scores = select_inputs(tmp_path)
    out = tmp_path / "d.jsonl"
    one_error_line(run("select", "-p", pool, "-s", scores, "-o", out, "--candidates", out), "same file", out)


def test_select_refuses_candidates_written_over_its_config(tmp_path):
    pool, scores = select_inputs(tmp_path)
    out = tmp_path / "d.jsonl"
    one_error_line(run("select", "-p", pool, "-s", scores, "-o", out, "--candidates", tmp_path / "d.config.json"),
                   "same file", out)


def test_train_refuses_records_written_over_the_manifest(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    before = path.read_text()
    one_error_line(run("train", path, "--out", tmp_path / "run", "--records", path, "--dry-run"), "--records",
                   tmp_path / "run")
    assert path.read_text() == before


# ---- silent wrong results ---------------------------------------------------------------

def test_recommend_refuses_scores_made_at_another_skip(tmp_path):
    pool, scores = select_inputs(tmp_path, n=40)
    out = tmp_path / "rec"
    one_error_line(run("recommend", "-m", "lab:xs", "-b", 2, "--pool", pool, "--scores", scores, "--skip-tokens", 3,
                       "-o", out, "--no-probe"), "--skip-tokens 0", out)


@pytest.mark.parametrize("bad", ["NaN", "-Infinity", "Infinity"])
def test_select_refuses_scores_that_are_not_finite(tmp_path, bad):
    pool, scores = select_inputs(tmp_path)
    lines = scores.read_text().splitlines()
    lines[2] = lines[2].replace('"logprob_sum": -2.0', f'"logprob_sum": {bad}')
    assert bad in lines[2]
    scores.write_text("\n".join(lines) + "\n")
    out = tmp_path / "d.jsonl"
    one_error_line(run("select", "-p", pool, "-s", scores, "-o", out), "not finite", out)


@pytest.mark.parametrize("flag", ["--split", "--revision", "--subset"])
def test_dataset_flags_on_a_jsonl_pool_are_refused(tmp_path, flag):
    pool, scores = select_inputs(tmp_path)
    out = tmp_path / "d.jsonl"
    one_error_line(run("select", "-p", pool, "-s", scores, "-o", out, flag, "main"), flag, out)


def test_revision_on_a_local_dataset_folder_is_refused(tmp_path):
    import datasets

    folder = tmp_path / "saved"
    datasets.Dataset.from_list([json.loads(x) for x in plain_pool(tmp_path / "p.jsonl").read_text().splitlines()]
                               ).save_to_disk(str(folder))
    _, scores = select_inputs(tmp_path)
    out = tmp_path / "d.jsonl"
    for flag in ("--revision", "--split"):
        one_error_line(run("select", "-p", folder, "-s", scores, "-o", out, flag, "main"), flag, out)


# ---- more tracebacks and smaller ones -------------------------------------------------

def test_advisor_home_a_loop_of_links_is_one_line(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.symlink_to(tmp_path / "home2")
    (tmp_path / "home2").symlink_to(home)
    monkeypatch.setenv("ADVISOR_HOME", str(home))
    one_error_line(run("recommend", "-m", "lab:xs", "-b", 2, "-o", tmp_path / "rec", "--no-probe"), "ADVISOR_HOME",
                   tmp_path / "rec")
    one_error_line(run("lab", "build", "--sizes", "xs"), "ADVISOR_HOME")


@pytest.mark.parametrize("budgets", ["8,99999999999999999999", "8,2000000"])
def test_compute_budgets_beyond_any_model_are_refused(tmp_path, budgets):
    out = tmp_path / "out"
    one_error_line(run("score", "-m", "lab:xs", "-p", plain_pool(tmp_path / "pool.jsonl"), "-o", out,
                       "--compute-budgets", budgets), "--compute-budgets", out)


def test_lab_pool_difficulty_is_bounded(tmp_path):
    out = tmp_path / "pool.jsonl"
    one_error_line(run("lab", "pool", "--difficulty", 100000, "--out", out), "--difficulty", out)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


def _modes(folder: Path) -> set[int]:
    return {p.stat().st_mode & 0o777 for p in folder.rglob("*") if p.is_file()}


def test_a_built_lab_student_keeps_the_umask(tmp_path, monkeypatch, umask_027):
    from capacity_advisor.models.lab.ladder import student_path

    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "home"))
    folder = Path(student_path("xs"))
    assert (folder / "model.safetensors").exists() and _modes(folder) == {umask_027}


def test_training_checkpoints_keep_the_umask(tmp_path, tiny_llama, umask_027):
    from capacity_advisor.training.sft import run_sft

    path = manifest(tmp_path / "rec", tiny_llama, epochs=1, batch_size=2, max_steps=2, eval_every=1,
                    learning_rate=1e-3, save_total_limit=None)
    run_sft(path, tmp_path / "run", device="cpu", dtype="float32", store=False)
    ckpts = sorted((tmp_path / "run").glob("checkpoint-*"))
    assert ckpts and all((c / "model.safetensors").exists() and _modes(c) == {umask_027} for c in ckpts)


def test_a_config_too_large_to_build_is_refused_from_its_numbers(tiny_llama, tmp_path, monkeypatch):
    import transformers

    folder = tmp_path / "huge"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(num_hidden_layers=10 ** 4, hidden_size=2 ** 20, intermediate_size=2 ** 21)
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: pytest.fail("built the model before counting its parameters"))
    out = tmp_path / "rec"
    one_error_line(run("recommend", "-m", folder, "-b", 2, "-o", out, "--no-probe"), "parameters", out)
    one_error_line(run("score", "-m", folder, "-p", plain_pool(tmp_path / "pool.jsonl"), "-o", tmp_path / "s",
                       "--device", "cpu"), "parameters", tmp_path / "s")


def test_an_output_path_that_is_not_utf8_is_refused_before_any_work(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run\xff")
    one_error_line(run("train", path, "--out", out, "--dry-run"), "not UTF-8")
    pool, scores = select_inputs(tmp_path)
    one_error_line(run("select", "-p", pool, "-s", scores, "-o", os.fsdecode(os.fsencode(str(tmp_path)) + b"/d\xff.jsonl")),
                   "not UTF-8")
    assert not any(b"\xff" in os.fsencode(p.name) for p in tmp_path.iterdir())


def test_a_lone_surrogate_in_rerank_candidates_is_refused_before_training(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs", epochs=3)
    (tmp_path / "rec" / "train.jsonl").write_text('{"id": "q0", "prompt": "what is 1 + 2?", "completion": "3"}\n' * 4)
    (tmp_path / "rec" / "cands.jsonl").write_text('{"id": "q0", "prompt": "what is 1 + 2?", "responses": ["3", "half \\ud800"]}\n')
    m = json.loads(path.read_text())
    m["training"]["rerank"] = {"epochs": [1], "candidates": "cands.jsonl", "score": "sum"}
    path.write_text(json.dumps(m))
    one_error_line(run("train", path, "--out", tmp_path / "run", "--dry-run"), "unpaired surrogate", tmp_path / "run")


def test_a_lone_surrogate_in_the_dataset_is_refused_before_training(tmp_path):
    path = manifest(tmp_path / "rec", "lab:xs")
    (tmp_path / "rec" / "train.jsonl").write_text('{"prompt": "what is 1 + 2?", "completion": "3 \\udc00"}\n')
    one_error_line(run("train", path, "--out", tmp_path / "run", "--dry-run"), "unpaired surrogate", tmp_path / "run")


# ---- one line means one line ------------------------------------------------------------

def test_skip_tokens_beyond_every_response_prints_no_pool_table(tiny_llama, tmp_path):
    out = tmp_path / "out"
    one_error_line(run("score", "-m", tiny_llama, "-p", plain_pool(tmp_path / "pool.jsonl"), "-o", out,
                       "--skip-tokens", 100000, "--device", "cpu"), "--skip-tokens")
    assert not (out / "scores.jsonl").exists()


def test_a_slow_stage_that_fails_leaves_only_the_error_line(tiny_llama, tmp_path, monkeypatch):
    """A stage's line is held until the stage succeeds, however long it takes: here loading sleeps
    past what the held line once waited (made short), then finds a mistake."""
    import time

    from capacity_advisor.advisor.cli import ui
    from capacity_advisor.core.errors import InputError

    monkeypatch.setattr(ui, "HOLD", 0.05, raising=False)

    def slow_then_bad(cfg):
        time.sleep(0.5)
        raise InputError("the model is damaged")

    monkeypatch.setattr("capacity_advisor.advisor.scoring.score.load_for", slow_then_bad)
    one_error_line(run("score", "-m", tiny_llama, "-p", plain_pool(tmp_path / "pool.jsonl"), "-o", tmp_path / "out"),
                   "damaged", tmp_path / "out")


def test_a_single_process_run_prints_no_launch_command_before_its_error(tmp_path, monkeypatch):
    from capacity_advisor.core.errors import InputError

    def refuse(*a, **k):
        raise InputError("the chat template cannot be rendered")

    monkeypatch.setattr("capacity_advisor.training.sft.run_sft", refuse)
    path = manifest(tmp_path / "rec", "lab:xs")
    one_error_line(run("train", path, "--out", tmp_path / "run"), "chat template")
    dry = run("train", path, "--out", tmp_path / "run", "--dry-run")
    assert dry.exit_code == 0 and "capacity_advisor.training.sft" in dry.stderr


def test_a_damaged_dataset_folder_is_one_line_without_the_librarys_bars(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"problem": "a", "generations": ["x"]}\n{"problem": \n')
    _, scores = select_inputs(tmp_path)
    out = tmp_path / "d.jsonl"
    code = ("import sys; from capacity_advisor.advisor.cli.main import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", code, "select", "-p", str(folder), "-s", str(scores), "-o", str(out)],
                       capture_output=True, text=True, timeout=HANG_S, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert not out.exists()


def test_recommend_skip_tokens_beyond_the_scoring_length_is_refused_before_loading(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr("capacity_advisor.models.loading.load_model", lambda *a, **k: pytest.fail("loaded the model"))
    out = tmp_path / "rec"
    line = one_error_line(run("recommend", "-m", tiny_llama, "-b", 2, "--pool", plain_pool(tmp_path / "pool.jsonl"),
                              "-o", out, "--score-length", 64, "--skip-tokens", 63, "--device", "cpu"),
                          "--skip-tokens 63 leaves nothing to score within --score-length 64", out)
    assert "lower --skip-tokens" in line


def test_torchs_notes_on_pickled_weights_never_reach_the_user(tiny_llama, tmp_path, monkeypatch):
    """A model folder of pytorch_model.bin. Torch before 2.6 warned from torch.serialization on such
    loads (weights_only); 2.13 does not, so the test makes torch.load warn as torch did, from torch's
    own module, and checks that nothing of it reaches the user's stderr."""
    import warnings

    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "bin-model"
    shutil.copytree(tiny_llama, folder)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    space = {"__name__": "torch.serialization", "real": torch.load, "warnings": warnings}
    exec("def load(*a, **k):\n"
         "    warnings.warn('You are using torch.load with weights_only=False (the current default value)', FutureWarning)\n"
         "    return real(*a, **k)\n", space)
    monkeypatch.setattr(torch, "load", space["load"])
    with warnings.catch_warnings(record=True) as seen:  # the warning does fire when nothing silences it
        warnings.simplefilter("always")
        space["load"](folder / "pytorch_model.bin", weights_only=True)
    assert any("weights_only" in str(w.message) for w in seen)
    with warnings.catch_warnings():  # shown on stderr, as outside a test (pytest would record them)
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        r = run("score", "-m", folder, "-p", plain_pool(tmp_path / "pool.jsonl"), "-o", tmp_path / "s",
                "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert "weights_only" not in r.stderr and "Warning" not in r.stderr, r.stderr
    assert (tmp_path / "s" / "scores.jsonl").exists()


# ---- a race's numbers bounded by the run ------------------------------------------------------

def test_a_race_share_below_one_step_or_a_lead_longer_than_a_run_is_refused(tmp_path, monkeypatch):
    no_loading(monkeypatch)
    path = race_manifest(tmp_path / "rec", "lab:s")  # 2 epochs of 4 steps: 8 steps, 8 evaluations
    out = tmp_path / "out"
    one_error_line(run("train", path, "--out", out, "--race", "1e-320"), "below one training step (a run here is 8 "
                   "steps): give a share of at least 0.125", out)
    one_error_line(run("train", path, "--out", out, "--race", 0.5, "--race-k", "99999999999999999999"),
                   "more evaluations in a row than a run here has (8)", out)
    assert run("train", path, "--out", out, "--race", 0.125, "--race-k", 8, "--dry-run").exit_code == 0
    assert not out.exists()
