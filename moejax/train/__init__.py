"""Training: state, step functions, checkpoints, metric writers and the loop."""
