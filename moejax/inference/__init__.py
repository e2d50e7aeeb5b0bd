"""Inference: restoring trained models and sampling from them."""
