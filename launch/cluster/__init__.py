"""What a sweep needs on a cluster: checks before it starts, SLURM's limits and errors, its data.

Holds the Hydra callbacks named in ``conf/config.yaml`` (:mod:`.callbacks`), the submitit launcher's
refusals as one line (:mod:`.slurm_launcher`, each attempt's time limit from :mod:`src.slurm_time`), the
sweep's data built on the CPU ahead of its GPU jobs (:mod:`.prepare`) and a one- or two-node SLURM
on localhost to try it all (``local_slurm.sh``).

Beside ``src`` and ``tasks``: :mod:`launch.analysis` (a multirun's end reads its records) and the
planning modules at ``launch/``'s top (the grid a sweep expands to). Never :mod:`launch.tools`.

May import: ``src``, ``tasks``, ``launch.cluster``, ``launch.analysis``, ``launch.plan``,
``launch.wandb_sweep``.
"""
