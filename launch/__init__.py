"""What runs around a run: planning a sweep, and the three rooms beside it.

At the top, the two planning commands: :mod:`launch.plan` (what a sweep will cost, before it is
launched) and :mod:`launch.wandb_sweep` (the same grid as a W&B Sweeps config); and
:mod:`launch.ask`, one question answered from start to end (paired seeds of a variant and its
baseline trained until the settle loop's answer, in one line). Beside them:

- :mod:`launch.analysis`: run records read back into the papers' tables, claims, verdicts and plots;
- :mod:`launch.cluster`: what a sweep needs on SLURM (Hydra callbacks, the submitit launcher's
  errors, attempt time limits, data prepared ahead, a local cluster to try it on);
- :mod:`launch.tools`: measuring instruments (the bench, the GPU check, FLOP counts) and the mmcv build.

The top layer (``launch → tasks → src``). The planning modules import each other and
:mod:`launch.tools.flops` (a step's cost), :mod:`launch.ask` the analysis it ends in; each
folder states its own rule in its docstring, and
:mod:`launch.analysis` imports neither :mod:`launch.cluster` nor :mod:`launch.tools`, nor the
planning modules (``tests/test_layering.py``).

May import: ``src``, ``tasks``, ``launch.plan``, ``launch.wandb_sweep``, ``launch.tools.flops``,
``launch.analysis``.
"""
