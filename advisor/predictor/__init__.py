"""The fitted predictor: probe measurements + the epoch budget -> high / low / mixed, and the
policy that ships it.

    rows = label_rows(read_records("calibration/records.jsonl"))      # labels.py
    table = cross_validate(rows, split="source", kind="lightgbm")      # policy.py, evaluate.py
    predictor = fit_predictor(rows, kind="lightgbm")                   # ensemble.py, members.py
    predictor.save("predictor/"); Predictor.load("predictor/").advise(measured, 3, "sum")

Modules: `labels` (records -> labelled rows, the input sets), `members` (the table of model kinds),
`forest` (LightGBM trees as checked numpy arrays), `checks` (the strict parse and the file's
fields checked), `ensemble` (the bagged ensemble, its range
check, neighbours and file), `evaluate` (regret, the baselines, folds, the noise floor), `policy`
(the predictor plus its fallback off the data, thresholds by cross-validation), `priors`
(advice without a probe: the lab prior below 10^8 parameters, the paper's findings from 10^8).
"""

from capacity_advisor.core.numbers import strict_loads
from capacity_advisor.advisor.predictor.ensemble import FORMAT, MAX_FILE_BYTES, Predictor, fit_predictor
from capacity_advisor.advisor.predictor.evaluate import (
    CONSTANTS, CV_SPLITS, PROXY, PROXY_CUT, SIZE_RULE, SPLITS, TIE_MARGIN, Rule, baseline_picks, cell_of, flips, folds,
    is_right, noise_floor, proxy_folds, regret, seed_spread, summarize,
)
from capacity_advisor.advisor.predictor.labels import (
    BUDGETS, CONTRAST_FEATURES, FEATURE_SETS, PROBE_FEATURES, TEACHER_FEATURES, best_up_to, inputs, label_rows, matrix,
    options_in, read_records, record_option, shape_of, unit_of,
)
from capacity_advisor.advisor.predictor.members import (
    FITTABLE, KINDS, check_member, fit_member, fit_members, lightgbm_params, member_proba,
)
from capacity_advisor.advisor.predictor.policy import (
    LARGEST_PROXY, PAPER_FROM, WITHOUT_PROXIES, Policy, calibrated_source, choose_policy, cross_validate, fallback, permutation_importance,
    seed_advice, select_policy,
)

__all__ = [
    "BUDGETS", "CONSTANTS", "CONTRAST_FEATURES", "CV_SPLITS", "FEATURE_SETS", "FITTABLE", "FORMAT", "KINDS", "MAX_FILE_BYTES",
    "LARGEST_PROXY", "PAPER_FROM", "PROBE_FEATURES", "PROXY", "PROXY_CUT", "SIZE_RULE", "SPLITS", "TEACHER_FEATURES", "TIE_MARGIN", "Policy", "Predictor", "Rule",
    "baseline_picks", "best_up_to", "calibrated_source", "cell_of", "check_member", "choose_policy", "cross_validate", "fallback", "fit_member",
    "fit_members", "fit_predictor", "flips", "folds", "inputs", "is_right", "label_rows", "lightgbm_params", "matrix",
    "member_proba", "noise_floor", "options_in", "permutation_importance", "proxy_folds", "read_records", "record_option", "regret",
    "seed_advice", "seed_spread", "select_policy", "shape_of", "strict_loads", "summarize", "unit_of", "WITHOUT_PROXIES",
]
