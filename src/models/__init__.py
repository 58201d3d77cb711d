"""Backbones the suite owns (the sandbox model of P5; LRA encoders and GPT in their own modules).

A model knows its attention sites and nothing of the engine or the run record: a task hands it
what it loads.

May import: ``src.models``, ``src.attention``, ``src.errors``.
"""
