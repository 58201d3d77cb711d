"""The run record: the files a run leaves in its folder, its identity, lock, session, checkpoints,
the recorder that writes rows and W&B, what a run announces, and the suite's one atomic writer
(:mod:`.atomic`, which every layer uses for a file a later reader trusts). It imports nothing of
:mod:`src.engine.loop`, :mod:`src.engine.task` or :mod:`src.engine.experiment`; of the engine's
top level only :mod:`src.engine.distributed` (which process writes); of the core beside the engine,
the variants' names and options, the errors and the resolvers a saved config is read with.

May import: ``src.engine.record``, ``src.engine.distributed``, ``src.attention``, ``src.errors``,
``src.resolvers``.
"""
