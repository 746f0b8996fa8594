"""The lab teacher's shipped pools (TASK-teacher-pool.jsonl.gz; README.md says how they were made): package
data, read with importlib.resources."""
