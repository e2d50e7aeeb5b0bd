"""Continual learning: a model learns tasks one after another and is measured on all of
them (prompt experts on a class-incremental stream, prompt_experts.py)."""
