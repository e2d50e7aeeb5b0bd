"""Dense-to-MoE conversion (Prism-MoE; MoEfication baselines): a dense SwiGLU FFN's
hidden neurons split into E equal groups (partition.py), the partition and router
fitted to the dense model's own generated trajectories (trajectory.py), the
confidence-weighted routing supervision (supervision.py) and the whole-model
conversion into a training workdir (convert.py; experiments/convert_dense.py)."""
