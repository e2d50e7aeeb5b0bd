"""moejax: Mixture-of-Experts research in JAX.

Every MoE variant is four swappable parts (see README "Architecture"):
router -> Routing, experts (parameters + per-expert function), dispatch
(how tokens meet experts) and losses (what the router is trained against).
"""
