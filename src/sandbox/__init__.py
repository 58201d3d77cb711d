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

Its modules, by what they are for:

* one run, watched: :mod:`~src.sandbox.record` (what the task calls), :mod:`~src.sandbox.snapshot`,
  :mod:`~src.sandbox.frames`, :mod:`~src.sandbox.page`; two runs side by side,
  ``python -m src.sandbox.compare RUN_A RUN_B`` (:mod:`~src.sandbox.compare`);
* one run, measured after the fact from its record: the stages of the accuracy curve
  (:mod:`~src.sandbox.stages`), the clustering head (:mod:`~src.sandbox.clustering`), both in one
  dict (:mod:`~src.sandbox.statistics`); loss-spike detection during training,
  :mod:`~src.sandbox.spikes` (no matplotlib: the loop imports it);
* P5's feed-forward learning-rate discount, the optimizer's parameter-group hook that
  ``experiment=paper/p5_mlp_lr`` names: :mod:`~src.sandbox.param_groups`;
* many seeds at once, P5's rates over seeds: ``python -m src.sandbox.seeds`` trains a seed set as
  one stacked model (:mod:`~src.sandbox.seeds`, the suite's one second training loop, its stacked
  model and weights file in :mod:`~src.sandbox.stacked`) and writes its curves
  (:mod:`~src.sandbox.curves`: no torch, so the report can read them); ``python -m
  src.sandbox.join`` joins sets trained apart (:mod:`~src.sandbox.join`);
  ``python -m launch.analysis.seed_sets`` sets them side by side (:mod:`launch.analysis.seed_sets`);
* P5's loss spikes where its code shows them, an associative memory under gradient descent:
  ``python -m src.sandbox.memory`` (:mod:`~src.sandbox.memory`).
"""
