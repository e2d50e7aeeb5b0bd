"""Dispatch backends: how token rows meet their experts.

All share one signature (see base.py) and are checked against the same
per-token reference loop, for every registered expert type and grouped
matmul (grouped_matmul.py), in tests/contract (and tests/dispatch).
"""

from moejax.assignment.layout import padding_waste
from moejax.dispatch.base import DISPATCHERS, get_dispatcher, register_dispatcher
from moejax.dispatch import capacity, dropless, memeff  # noqa: F401  (imported to register)
from moejax.dispatch.grouped_matmul import GROUPED_MATMULS, register_grouped_matmul

__all__ = [
  "DISPATCHERS",
  "GROUPED_MATMULS",
  "get_dispatcher",
  "padding_waste",
  "register_dispatcher",
  "register_grouped_matmul",
]
