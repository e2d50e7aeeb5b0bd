"""Where time goes: compiled moejax programs by part (XLA thunks attributed by named
scope and source frame), transformers models by module hooks, and their tables; the
generation benchmark's measurements (generation.py, generation_profile.py), the
conversion benchmark's (conversion.py), the MoE layer's paths (moe_layer.py), the
compressed expert types' layers (compressed_experts.py), the expert-parallel layer
(expert_parallel.py), the Triton grouped matmul's speed (gmm_speed.py), seed-batched
training's two arms (seed_batched.py), and the timing and compiled figures every
benchmark shares (timing.py)."""
