"""Flax NNX modules: they hold parameters and call the pure functions."""
