"""The probe stage from the advisor's side: its plan, the held-out split and the run (`stage`)."""
