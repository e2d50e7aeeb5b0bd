"""Knowledge distillation of a teacher LM into a student: the objectives
(objectives.py: the 'kl' baseline and residual KD, registered by name in
DISTILL_METHODS) and the stage-1 modules of residual KD (modules.py: the expert
attention that fuses an MoE teacher's expert outputs, the low-dimensional
projector autoencoder, and cross-model attention between two tokenizations).

The training task that runs them is moejax/train/distill.py (config task='distill').
"""
