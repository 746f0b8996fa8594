"""One evaluation for every training run: full SFT, calibration runs and probes alike.

    ev = Evaluator(rows, checker="lab", max_new_tokens=48, base=base_lm, teacher=teacher_lm)
    texts = ev.generate(lm, range(len(rows)), seed=0)       # may be split over processes
    row = ev.measure(lm, texts)                             # on one process

Rows are the eval set's: `prompt`, optional `answer`, optional `references` ({kind: text or
[texts]}: held-out teacher responses). At each evaluation point the student generates one
completion per prompt (greedy unless a temperature is set), and this module reports:

- from the generations: accuracy (pass@1, with the checker), answer_rate, repetition_rate
  (`training.text_metrics.is_repetitive`, the one loop detector), copy_rate, finish_rate (the share
  that ended with EOS rather than at the token limit), mean_chars;
- answer_logprob: log p(reference answer | prompt, the student's own reasoning up to its answer
  marker), teacher-forced and averaged over problems — a continuous, low-noise companion of
  accuracy (the marker is `;A` in the lab, `\\boxed{` in math);
- teacher_nll (and teacher_nll_<kind>): the student's mean NLL per token of the held-out teacher
  responses, each response weighted equally — movement toward the teacher's data;
- base_drift: the frozen base student's NLL per token of the generations (the paper's "original
  model view"), when a base model is given;
- teacher_view: the teacher model's NLL per token of the generations (the paper's "teacher
  view", its Figure 2), when a teacher model is given.

The base student and the teacher do not change, so their NLL of a generation is kept per
(prompt, generation) for the process's later evaluations — of the same run, and of the other runs
of the same base and teacher (calibration trains several sets of one student in one process).
The cache belongs to the model object and to the state of its weights (each parameter's
storage and in-place version counter, `_fixed_scores`), so a model changed in place, or another
model, never reads scores it did not make. Once a student's greedy generations settle, most of them repeat from
one evaluation to the next and are not scored again (`python -m experiments.run_profile` measures it).

It also counts the forward tokens an evaluation reads (`eval_tokens`, cached scores included, so
the count is the protocol's, the same in any process), and of them those it generated
(`generated_tokens`), for cost reports. With
`per_problem`, the row also keeps each problem's correctness, answer log-likelihood and loop
flag, so a cheaper evaluation (fewer problems) can be replayed from a richer one.
"""

from __future__ import annotations

from statistics import mean
from typing import Sequence

from capacity_advisor.models.backends import make_backend
from capacity_advisor.models.template import Encoded, prompt_ids, response_ids
from capacity_advisor.training import text_metrics as metrics
from capacity_advisor.training.manifest import TrainingSpec

ANSWER_MARKERS = {"lab": ";A", "math": "\\boxed{"}
SCORED = ("answer_logprob", "teacher_nll", "base_drift", "teacher_view")  # the measures that score (eval.measure_every)
# id(module) -> (a weak reference to it, the state of its weights, {(length, prompt, text): (mean log-prob, tokens)})
FIXED_SCORES: dict[int, tuple] = {}
FIXED_SCORES_MAX = 200_000  # pairs kept per model; past it its cache starts over


def _fixed_scores(lm) -> dict:
    """The scores cache of the fixed model `lm` as its weights are now: a new one when the module
    is another object than the one the cache was made for, or any parameter was replaced or
    changed in place since."""
    import weakref

    module = lm.model
    state = tuple((p.data_ptr(), p._version) for p in module.parameters())
    held = FIXED_SCORES.get(id(module))
    if held is None or held[0]() is not module or held[1] != state or len(held[2]) > FIXED_SCORES_MAX:
        for key in [k for k, (ref, _, _) in FIXED_SCORES.items() if ref() is None]:
            del FIXED_SCORES[key]  # modules that no longer exist
        held = FIXED_SCORES[id(module)] = (weakref.ref(module), state, {})
    return held[2]
ANSWER_CLOSERS = {"lab": "", "math": "}"}


def answer_prefix(text: str, checker: str) -> str | None:
    """The generation up to and including its last answer marker; the marker appended when absent.

    None for checkers without a marker. A lab response may also be answer-only (`A7`).
    """
    marker = ANSWER_MARKERS.get(checker)
    if marker is None:
        return None
    cut = text.rfind(marker)
    if cut >= 0:
        return text[:cut + len(marker)]
    if checker == "lab" and text.startswith("A"):
        return "A"
    return text.rstrip() + marker


def references_of(row: dict) -> list[tuple[str, str]]:
    """(kind, text) for every held-out teacher response of an eval row."""
    refs = row.get("references") or {}
    out = []
    for kind, texts in refs.items():
        for t in [texts] if isinstance(texts, str) else texts:
            if isinstance(t, str) and t.strip():
                out.append((str(kind), t))
    return out


class Evaluator:
    """Generation and scoring at one evaluation point (see the module doc)."""

    def __init__(self, rows: Sequence[dict], checker: str, max_new_tokens: int, temperature: float = 0.0,
                 max_length: int = TrainingSpec.max_length, base=None, teacher=None, token_budget: int | None = None,
                 per_problem: bool = False, view_limit: int | None = None):
        self.rows = list(rows)
        self.checker = checker
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.max_length = max_length
        self.base = base  # LoadedModel of the frozen base student, or None
        self.teacher = teacher  # LoadedModel of the teacher, or None
        self.token_budget = token_budget
        self.per_problem = per_problem
        self.view_limit = view_limit
        self.cache_views = True  # keep the fixed models' NLL of each (prompt, generation) for later evaluations

    def _backend(self, lm):
        return make_backend("hf", lm, token_budget=self.token_budget)

    def generate(self, lm, indices: Sequence[int], seed: int = 0, progress=None) -> list[dict]:
        """Completions (dicts of text, n_tokens, finished) for the rows at `indices`; `progress(n)`
        hears each batch of n prompts finished."""
        if not indices:
            return []
        outs = self._backend(lm).generate([self.rows[i]["prompt"] for i in indices], self.max_new_tokens,
                                          temperature=self.temperature, seed=seed, details=True,
                                          progress=progress)
        return [o[0] for o in outs]

    def measure(self, lm, gens: Sequence[dict], scores: bool = True) -> dict:
        """Every metric of the module doc for one set of generations (one per row, in order).
        Without `scores`, those read off the generations only: the scoring measures
        (`SCORED`) are None and `eval_tokens` counts the generated tokens."""
        texts = [g["text"] for g in gens]
        prompts = [r["prompt"] for r in self.rows]
        answers = [r.get("answer") for r in self.rows]
        has_refs = self.checker != "none" and any(a is not None for a in answers)
        row: dict = {
            "accuracy": float(metrics.accuracy(texts, answers, self.checker)) if has_refs and texts else None,
            "answer_rate": float(metrics.answer_rate(texts, self.checker)) if self.checker != "none" and texts else None,
            "repetition_rate": float(metrics.repetition_rate(texts)) if texts else None,
            "copy_rate": float(metrics.copy_rate(prompts, texts)) if texts else None,
            "finish_rate": float(mean(bool(g["finished"]) for g in gens)) if gens else None,
            "mean_chars": float(mean(len(t) for t in texts)) if texts else None,
        }
        if self.per_problem:
            row["per_problem"] = {
                "correct": [bool(metrics.check_answer(t, a, self.checker)) for t, a in zip(texts, answers)] if has_refs else None,
                "repetitive": [bool(metrics.is_repetitive(t)) for t in texts],
                "answered": [metrics.extract_answer(t, self.checker) is not None for t in texts]
                if self.checker != "none" else None,
            }
        spent = sum(int(g["n_tokens"]) for g in gens)
        row["generated_tokens"] = spent
        if not scores:
            row.update(dict.fromkeys(SCORED), eval_tokens=spent)
            return row
        student = self._backend(lm)

        # answer log-likelihood, teacher-forced after the student's own reasoning
        if has_refs and texts and self.checker in ANSWER_MARKERS:
            tok = lm.tokenizer
            enc = []
            for p, t, a in zip(prompts, texts, answers):
                if a is None:
                    continue
                head = prompt_ids(tok, p) + response_ids(tok, answer_prefix(t, self.checker))
                tail = response_ids(tok, str(a) + ANSWER_CLOSERS[self.checker])
                ids = head + tail
                if len(ids) > self.max_length:  # keep the answer and as much reasoning as fits
                    ids = ids[:1] + ids[len(ids) - self.max_length + 1:]
                enc.append(Encoded(ids, len(ids) - len(tail), False))
            scored = student.score_encoded(enc)
            row["answer_logprob"] = float(mean(s["logprob_sum"] for s in scored)) if scored else None
            spent += sum(len(e.input_ids) for e in enc)
            if self.per_problem and len(scored) == len(texts):
                row["per_problem"]["answer_logprob"] = [s["logprob_sum"] for s in scored]
        else:
            row["answer_logprob"] = None

        refs = [(kind, r["prompt"], text) for r in self.rows for kind, text in references_of(r)]
        if refs:
            scored = student.score([(p, t) for _, p, t in refs], max_length=self.max_length)
            nll = [-s["logprob_mean"] for s in scored]
            row["teacher_nll"] = float(mean(nll))
            for kind in sorted({k for k, _, _ in refs}):
                row[f"teacher_nll_{kind}"] = float(mean(v for (k, _, _), v in zip(refs, nll) if k == kind))
            spent += sum(s["n_tokens"] for s in scored)
        else:
            row["teacher_nll"] = None

        pairs = [(p, t) for p, t in zip(prompts, texts) if t.strip()][: self.view_limit]
        for name, other in (("base_drift", self.base), ("teacher_view", self.teacher)):
            if other is None or not pairs:
                row[name] = None
                continue
            scored = self._view(other, pairs)
            row[name] = float(mean(-lp for lp, n in scored if n))
            spent += sum(n for _, n in scored)  # what the evaluation reads, scored now or read from the cache
        row["eval_tokens"] = spent
        return row

    def _view(self, other, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]:
        """(mean log-prob, tokens) of each pair under the fixed model `other`; pairs an earlier
        evaluation scored with these weights are read from `FIXED_SCORES`, not scored again."""
        cache = _fixed_scores(other) if self.cache_views else {}
        keys = [(self.max_length, *p) for p in pairs]
        todo = list(dict.fromkeys(k for k in keys if k not in cache))
        scored = self._backend(other).score([k[1:] for k in todo], max_length=self.max_length) if todo else []
        fresh = {k: (s["logprob_mean"], s["n_tokens"]) for k, s in zip(todo, scored)}
        cache.update(fresh)
        return [fresh.get(k) or cache[k] for k in keys]
