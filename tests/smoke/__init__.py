"""Per task family: the overrides under which each task trains 2 steps on tiny data in its
real on-disk layout, and ``prepare(data_dir)``, which writes that data.

``tests/test_sweeps.py`` discovers every module here: a new task family adds one module
with ``OVERRIDES: dict[str, list[str]]`` (task name -> overrides) and ``prepare``.
"""
