"""Where time goes: compiled moejax programs by part (XLA thunks attributed by named
scope and source frame), transformers models by module hooks, and their tables; the
generation benchmark's measurements (generation.py, generation_profile.py), the
conversion benchmark's (conversion.py), and the timing and compiled figures every
benchmark shares (timing.py)."""
