"""Tasks: one module per family, each building its data, model and metric from its config."""
