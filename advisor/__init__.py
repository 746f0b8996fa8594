"""The CLI and the decisions: reading pools, selection, the predictor, reports."""
