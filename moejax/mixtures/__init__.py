"""Mixture models and clustering: k-means (Lloyd and Hartigan), EM for Gaussian
mixtures and its federated form (FedGEM), mixtures on spheres, mixture score networks,
and synthetic problems with known clusters (synthetic.py). Each method says in its
docstring which parts are guesses."""
