"""Tasks: one module per family, each building its data, model and metric from its config.

The middle layer (``launch → tasks → src``): a task imports the core, never :mod:`launch`.

May import: ``src``, ``tasks``.
"""
