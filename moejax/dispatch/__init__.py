"""Dispatch backends: how token rows meet their experts.

All share one signature (see base.py) and are checked against the same
per-token reference loop, for every registered expert type and grouped
matmul (grouped_matmul.py), in tests/contract (and tests/dispatch).
"""
from moejax.assignment.layout import padding_waste  # noqa: F401  (re-exported)
from moejax.dispatch.base import DISPATCHERS, get_dispatcher, register_dispatcher
from moejax.dispatch import capacity, dropless, memeff  # registers
from moejax.dispatch.grouped_matmul import GROUPED_MATMULS, register_grouped_matmul
