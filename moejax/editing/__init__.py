"""Knowledge editing through the experts (MoEEdit, arXiv 2602.10965) and its
baselines, as registered edit methods (moejax/editing/methods.py)."""
