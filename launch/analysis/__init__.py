"""Run records read back into results: the papers' tables, the claims' verdicts, plots, dashboards.

Holds the readers of run folders and W&B runs (:mod:`.records`, :mod:`.record_shapes`,
:mod:`.reading_files`), the experiments' numbers (:mod:`.results`, :mod:`.glue_table`, the papers'
own in :mod:`.paper`), the statistics (:mod:`.stats`, :mod:`.time_to_quality`), the claims and
their verdicts (:mod:`.claims`, :mod:`.verdicts`, :mod:`.seed_verdicts`; the one verdict row, its
adjustment and renderer in :mod:`.verdict_row`, the measures' registry in :mod:`.measures`), P5's
seed sets side by side (:mod:`.seed_sets`), what turns them into pages (:mod:`.report`, :mod:`.plots`,
:mod:`.dashboard`, :mod:`.dashboard_spec`) and the seeds added until a verdict is known
(:mod:`.settle`, the commands it reruns in :mod:`.relaunch`).

Never :mod:`launch.cluster`, :mod:`launch.tools` or the planning modules at ``launch/``'s top:
reading results needs no cluster and no instrument.

May import: ``src``, ``tasks``, ``launch.analysis``.
"""
