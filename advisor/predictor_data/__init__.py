"""The shipped predictor (predictor.json) and the paper's findings (paper_findings.json): package data,
read with importlib.resources."""
