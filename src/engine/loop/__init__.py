"""The loop: what trains and evaluates a model (steps, data, processes' batches, optimizer and
schedule, preemption, progress, evaluation). It may import :mod:`src.engine.record` (where its
rows and checkpoints go), :mod:`src.engine.distributed` and, for types, :mod:`src.engine.task`
(the contract it serves); never :mod:`src.engine.experiment`, which composes it. Of the core
beside the engine: the variants, the conditioning monitor and the errors.

May import: ``src.engine.loop``, ``src.engine.record``, ``src.engine.distributed``, ``src.engine.task``,
``src.attention``, ``src.conditioning``, ``src.errors``.
"""
