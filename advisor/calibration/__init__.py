"""Calibration: one unit (a student on a pool at a seed) scored, probed and trained on each set
(`unit`); its two callers, your proxies on your pool (`proxies`, with what a dry run states it
costs: `cost`) and the lab's sweep (`sweep`, its settings and grid: `grid`)."""
