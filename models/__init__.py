"""Everything that touches weights: loading, describing, scoring, generation, and the embedded lab."""
