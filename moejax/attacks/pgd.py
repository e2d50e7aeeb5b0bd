"""`pgd`: l-infinity projected gradient descent on the cross-entropy (Madry et al. 2018,
eq. 2), the baseline the router-targeted attacks are measured against: uniform sign
steps, every frame alike."""

from moejax.attacks.base import ATTACKS, Attack, cross_entropy


def pgd_objective(model, x_adv, y, clean, settings):
  """CE(f(x + delta), y)."""
  del clean, settings
  logits, _, _ = model(x_adv)
  return cross_entropy(logits, y)


ATTACKS.add("pgd", Attack(objective=pgd_objective))
