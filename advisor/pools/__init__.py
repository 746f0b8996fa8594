"""Pools: reading one in any layout (`read`, with `files`, `layout`, `options`), writing one from
a teacher (`generate`), and the lab's pools (`lab`: the scripted teacher's; the lab teacher's
sampled ones ship beside it as TASK-teacher-pool.jsonl.gz, lab-teacher-pools.md says how)."""
