"""The visual sandbox (P5): watch a 2-D transformer learn, step by step, in its run folder.

At every validation the ``modadd`` task calls :func:`src.sandbox.record.record_snapshot`,
which writes under ``<run_dir>/sandbox/``:

* ``snapshots/step_<step>.npz`` -- every layer of the model on a fixed probe batch
  (:mod:`src.sandbox.snapshot`);
* ``frames/step_<step>.png`` -- the frame drawn from it and the record so far
  (:mod:`src.sandbox.frames`);
* ``index.html`` -- every frame behind a slider and the loss spikes in a table, rewritten at
  each frame so that it can be watched during training; ``training.gif`` at the end
  (:mod:`src.sandbox.page`).

Two runs side by side: ``python -m src.sandbox.compare RUN_A RUN_B`` (:mod:`src.sandbox.compare`).
Loss-spike detection: :mod:`src.sandbox.spikes` (no matplotlib: the loop imports it).
P5's findings as per-run numbers, read from the record after the fact: the stages of the
accuracy curve (:mod:`src.sandbox.stages`), the clustering head (:mod:`src.sandbox.clustering`),
both in one dict (:mod:`src.sandbox.statistics`).
"""
