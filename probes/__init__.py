"""Probe runs: the trainer stopped early on D_high / D_low from one base, the scale-free features of
their curves (`run`), and the recipe a probe is run with for each kind of student (`recipe`)."""
