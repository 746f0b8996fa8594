"""`python -m experiments.cv_tables FIT --sources A,B`: the gated race held out on given sources only,
pooled by their rows, read from a fit's stored tables."""

from experiments.cv_tables import sources_table


def table(by_source: dict, high: dict) -> dict:
    return {"methods": {"gated race": {"by_source": by_source}, "always high": {"by_source": high}}}


CV = {"source": table({"a": {"rows": 30, "regret": 1.0, "overhead": 0.2}, "b": {"rows": 10, "regret": 5.0, "overhead": 0.6},
                       "c": {"rows": 5, "regret": 0.0, "overhead": 0.0}},
                      {"a": {"rows": 30, "regret": 2.0}, "b": {"rows": 10, "regret": 10.0}, "c": {"rows": 5, "regret": 0.0}}),
      "shape": table({"a": {"rows": 30, "regret": 1.5, "overhead": 0.1}}, {"a": {"rows": 30, "regret": 2.0}})}


def test_the_named_sources_are_pooled_by_their_rows(capsys):
    assert sources_table(CV, ["a", "b"]) == 0
    out = capsys.readouterr().out
    # (30 × 1 + 10 × 5) / 40 = 2.0 points at (30 × 0.2 + 10 × 0.6) / 40 = 30 %; always-high (60 + 100) / 40 = 4.0
    assert "| **pooled** | 40 | **2.00 at 30 %** | 4.00 |" in out
    assert "| b | 10 | 5.00 at 60 % | 10.00 |" in out and "| c |" not in out
    assert "(held out by shape (deep-narrow or shallow-wide students held out): no rows of b)" in out


def test_a_source_no_table_holds_is_one_error_line(capsys):
    assert sources_table(CV, ["a", "nosuch"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: nosuch in no held-out table") and err.count("\n") == 1


def test_the_gated_table_says_the_overhead_in_tokens_where_the_fit_counted_them(capsys):
    from experiments.cv_tables import gated_table

    gated = {"regret": 1.0, "overhead": 0.2, "opened": 0.25, "overhead_where_open": 0.8,
             "overhead_tokens": 0.1, "overhead_tokens_where_open": 0.4, "by_source": {}}
    gated_table({"source": {"methods": {"gated race": gated, "always high": {"regret": 2.0}}}})
    out = capsys.readouterr().out
    assert "| in tokens (where open) |" in out and "| 1.00 at 20 % | 10.0 % (40.0 %) | 2.00 |" in out
    assert "lack their count" not in out
    gated["tokens_unknown"] = 3
    gated_table({"source": {"methods": {"gated race": gated, "always high": {"regret": 2.0}}}})
    assert "lack their count, taken at their share: pool source 3)" in capsys.readouterr().out
    del gated["overhead_tokens"]  # a fit from before the count: no such column
    gated_table({"source": {"methods": {"gated race": gated, "always high": {"regret": 2.0}}}})
    assert "in tokens" not in capsys.readouterr().out
