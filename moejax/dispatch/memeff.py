"""Dispatch 'dropless_memeff': the expert type's own fused path over the whole
layer, e.g. SwiGLU's memory-efficient SonicMoE kernel (moejax/experts/swiglu_memeff.py);
ConfigError for a type or plain expert function without one. Dispatch
'dropless' with grouped_matmul 'fused' runs the same path (and 'auto' picks it
on CPU for expert types that have one). Registered, with the settings section it
shares with 'dropless' (model.moe.dropless), in dropless.py.
"""

from moejax.errors import ConfigError
from moejax.experts.base import experts_of


def dispatch_dropless_memeff(x, routing, expert_fn, cfg):
  """The expert type's fused path (see module doc)."""
  experts = experts_of(expert_fn)
  if experts is None or not experts.has_fused:
    what = f"expert type {experts.type.name!r}" if experts is not None else repr(expert_fn)
    raise ConfigError(
      f"model.moe.dispatch={cfg.get('dispatch', 'dropless')!r} with model.moe.grouped_matmul="
      f"{cfg.grouped_matmul!r} runs the expert type's fused path, but {what} declares "
      "none (a registered ExpertType with `fused`, moejax/experts/base.py); use "
      "grouped_matmul 'loop' or another matmul"
    )
  return experts.fused(x, routing, cfg)
