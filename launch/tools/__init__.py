"""Measuring instruments and build helpers, each run by hand or by ``make``.

Holds the bench (:mod:`.bench`, with :mod:`.bench_shapes` and :mod:`.bench_training`), the GPU check
(:mod:`.gpu_check`, its sections in :mod:`.gpu_check_kernels`, :mod:`.gpu_check_loop` and
:mod:`.gpu_check_steps`), the FLOP and kernel counts of a step (:mod:`.flops`, which
:mod:`launch.plan` prices runs with) and mmcv's compiled ops built or found in a cache
(:mod:`.mmcv_build`, :mod:`.mmcv_target`).

Beside ``src`` and ``tasks``: :mod:`launch.analysis` (the training bench reads its runs back) and
the planning modules at ``launch/``'s top (the config a check composes). Never :mod:`launch.cluster`.

May import: ``src``, ``tasks``, ``launch.tools``, ``launch.analysis``, ``launch.plan``,
``launch.wandb_sweep``.
"""
