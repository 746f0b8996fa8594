"""gpu_check's fixed inputs: the student shapes, the sizes of each part (full and --quick) and the
assumed pool `advisor recommend` is projected on.

STUDENTS holds the public config.json numbers of each student; QUICK_* shrink shapes and lengths
so that the whole path runs on a CPU; AGREEMENT sizes the agreement part; EndToEnd sizes the real
`advisor recommend` run on a generated pool. PoolAssumption is an assumption, not a measurement.
MEASURED names the fields of each student measurement that the projection reads and the tests
check. PART_SECONDS is what each part is expected to take on one H200-class GPU (docs/gpu-check.md
says how it was sized): a part that would end past --budget-s is skipped, not started.
"""

from dataclasses import dataclass

@dataclass(frozen=True)
class Student:
    label: str  # the model whose architecture this is
    shape: dict  # Qwen2Config fields, as in the model's public config.json
    lora_r: int  # the probe's --lora-r at this size: 0 = full fine-tuning


STUDENTS = {
    "qwen2.5-1.5b": Student("Qwen2.5-1.5B", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151_936,
                                                  tie_word_embeddings=True), lora_r=0),
    "qwen2.5-7b": Student("Qwen2.5-7B", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                              num_attention_heads=28, num_key_value_heads=4, vocab_size=152_064,
                                              tie_word_embeddings=False), lora_r=16),
}
# --quick: each student keeps its tying and its probe mode; the rest shrinks to what a CPU runs in seconds
QUICK_SHAPE = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=4096)
QUICK_LENGTHS = dict(max_length=64, max_new_tokens=16)  # the probe recipe's lengths under --quick, as results name them
QUICK_SCORE_MAX_LENGTH = 128
# the agreement model's settings (the first part), full and under --quick
AGREEMENT = dict(vocab=151_936, hidden=1024, layers=12, pairs=256, min_response=256, max_response=2048,
                 long_tokens=16384, gen_prompts=64, gen_n=4, gen_tokens=256)
QUICK_AGREEMENT = dict(vocab=2048, hidden=64, layers=1, pairs=8, min_response=8, max_response=24, long_tokens=200,
                       gen_prompts=2, gen_n=2, gen_tokens=4)
SCORING_PAIRS, QUICK_SCORING_PAIRS = 32, 4  # pairs timed per student, of the pool's shape (--scoring-pairs)
TIMED_STEPS, QUICK_TIMED_STEPS = 3, 1  # training steps timed after one warm-up step (probe and full run)
NAIVE_PAIRS, QUICK_NAIVE_PAIRS = 8, 2  # of the scoring pairs, timed again through the naive loop
# New tokens timed in the evaluation's generation, at the batch the recipe's full cap gives: half the
# cap halves the part's time; the rate is read as the cap's (a longer cache may lower it).
GEN_TIMED_TOKENS, QUICK_GEN_TIMED_TOKENS = 1024, 4
MAX_POSITIONS = 32768  # room for every length used here; the position limit does not change the cost


@dataclass(frozen=True)
class PoolAssumption:
    """The pool `advisor recommend` is projected on: an assumption, not a measurement."""

    problems: int = 12_000
    candidates: int = 4  # teacher responses per problem, all scored
    prompt_tokens: int = 128
    response_tokens: int = 4_000  # long reasoning traces: cut at the scoring and the training length


QUICK_POOL = PoolAssumption(prompt_tokens=16, response_tokens=120)


@dataclass(frozen=True)
class EndToEnd:
    """The real `advisor recommend` run at one student's shape, on a pool generated here. The
    evaluations are cut (held-out problems, new tokens) so that the run fits the check's time; the
    projection prices the recipe's own from the generation part's rate."""

    problems: int = 64
    candidates: int = 4
    prompt_tokens: int = 128
    response_tokens: int = 2_048
    eval_problems: int = 8  # --probe-eval-problems
    max_new_tokens: int = 128  # --max-new-tokens
    budget: float = 3.0  # --budget (epochs)
    steps: int | None = None  # --probe-steps; None: the recipe's


QUICK_E2E = EndToEnd(problems=12, prompt_tokens=16, response_tokens=40, eval_problems=2, max_new_tokens=4, steps=1)
E2E_STUDENT = "qwen2.5-1.5b"

# Expected seconds of each part on one H200-class GPU (docs/gpu-check.md: how they were sized);
# `recommend` is the end-to-end run, `agreement` the random-init model's part.
PART_SECONDS = {"qwen2.5-1.5b": 90, "qwen2.5-7b": 150, "recommend": 150, "agreement": 60}

# The measured fields of each student, all positive and finite when a measurement ran; the test
# checks them and `project` reads them.
MEASURED = {
    "scoring": ("seconds", "response_tokens_per_s", "forward_tokens_per_s", "peak_memory_mb"),
    "probe_step": ("seconds_per_step", "tokens_per_step", "peak_memory_mb", "resident_memory_mb"),
    "full_run_step": ("seconds_per_step", "tokens_per_step", "peak_memory_mb", "resident_memory_mb"),
    "generation": ("seconds", "new_tokens", "new_tokens_per_s", "peak_memory_mb"),
}
