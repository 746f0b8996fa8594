"""Pools: reading one in any layout (`read`, with `files`, `layout`, `options`), writing one from
a teacher (`generate`) and the lab's scripted pools (`lab`)."""
