"""experiments.pool_repetition: its rank correlation and its table."""

import math

from experiments.pool_repetition import markdown, spearman


def test_rank_correlation_of_the_repetition_gap_with_the_lead():
    assert spearman([0.0, 0.1, 0.3], [-5.0, 2.0, 9.0]) == 1.0
    assert spearman([0.3, 0.1, 0.0], [-5.0, 2.0, 9.0]) == -1.0
    assert math.isnan(spearman([0.1, 0.2], [1.0, 2.0]))  # two sources rank nothing
    assert math.isnan(spearman([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]))  # a gap that never moves says nothing


def test_table_shows_each_source_and_a_set_without_trigrams_as_a_dash():
    row = {"source": "round/scripted", "rows": 4, "trigram_repetition_high": math.nan, "trigram_repetition_low": 0.25,
           "gap_trigram_repetition": math.nan, "length_ratio_low_high": 9.61, "likelihood_gap_per_token": -0.15,
           "records_likelihood_gap_per_token": -0.15, "low_lead": -0.4, "low_wins": 0, "high_wins": 2}
    text = markdown({"sources": [row], "rank_correlation": math.nan})
    assert "| round/scripted | 4 | — | 0.25 | — | 9.61 | -0.150 / -0.150 | -0.4 | 0 / 2 |" in text
