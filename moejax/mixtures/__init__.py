"""Mixture models and clustering (issue 16): k-means (Lloyd and Hartigan), EM for
Gaussian mixtures and its federated form (FedGEM), mixtures on spheres, mixture
score networks. Each method says in its docstring which parts are guesses."""
