"""Backbones the suite owns (the sandbox model of P5; LRA encoders and GPT in their own modules)."""
