"""probes room — see DESIGN.md."""
