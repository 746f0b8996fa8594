"""training room — see DESIGN.md."""
