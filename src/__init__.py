"""conditioned-attention: does this attention variant train better than softmax attention?

The core: attention variants, conditioning measures, the engine, the models, the sandbox. It is the
lowest layer (``launch → tasks → src``): nothing here imports :mod:`tasks` or :mod:`launch`
(``tests/test_layering.py`` reads the line below, and each sub-package's own where it has one).

May import: ``src``.
"""
