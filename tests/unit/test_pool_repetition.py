"""experiments.pool_repetition: its rank correlation and its table."""

import math

from experiments.pool_repetition import correlations, markdown, spearman


def test_rank_correlation_of_the_repetition_gap_with_the_lead():
    assert spearman([0.0, 0.1, 0.3], [-5.0, 2.0, 9.0]) == 1.0
    assert spearman([0.3, 0.1, 0.0], [-5.0, 2.0, 9.0]) == -1.0
    assert math.isnan(spearman([0.1, 0.2], [1.0, 2.0]))  # two sources rank nothing
    assert math.isnan(spearman([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]))  # a gap that never moves says nothing


def test_table_shows_each_source_and_a_set_without_trigrams_as_a_dash():
    row = {"source": "round/scripted", "rows": 4, "trigram_repetition_high": math.nan, "trigram_repetition_low": 0.25,
           "gap_trigram_repetition": math.nan, "length_ratio_low_high": 9.61, "likelihood_gap_per_token": -0.15,
           "records_likelihood_gap_per_token": -0.15, "low_lead": -0.4, "low_wins": 0, "high_wins": 2}
    text = markdown({"sources": [row], "rank_correlation": correlations([row])})
    assert "| round/scripted | 4 | — | 0.25 | — | 9.61 | -0.150 / -0.150 | -0.4 | 0 / 2 |" in text
    assert "gap_trigram_repetition —, length_ratio_low_high —" in text  # one source ranks nothing


def test_each_contrast_is_ranked_against_the_lead_where_it_is_a_number():
    rows = [{"gap_trigram_repetition": g, "length_ratio_low_high": r, "likelihood_gap_per_token": -r, "low_lead": lead}
            for g, r, lead in ((0.1, 2.0, -5.0), (math.nan, 9.0, 8.0), (0.0, 17.0, 30.0), (0.2, 1.2, -9.0))]
    c = correlations(rows)
    assert c["length_ratio_low_high"] == 1.0 and c["likelihood_gap_per_token"] == -1.0
    assert c["gap_trigram_repetition"] == -1.0  # ranked over the three sources where it is a number
