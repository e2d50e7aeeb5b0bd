"""Continual learning: a model learns tasks one after another and is measured on all of
them (prompt experts on a class-incremental stream, prompt_experts.py; FlyPrompt's
analytic router and EMA heads, rear.py, and its stream with blurry boundaries,
flyprompt.py)."""
