"""Scoring and selection: every candidate scored under the student (`score`), D_high / D_low /
D_mixed selected (`select`), compute-responsive problems (`compute`), and `advisor score` / `advisor
select` as one library call each (`jobs`)."""
