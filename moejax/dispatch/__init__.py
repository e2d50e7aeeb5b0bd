"""Dispatch backends: how token rows meet their experts.

All share one signature (see base.py) and are checked against the same
per-token reference loop in tests/dispatch.
"""
from moejax.dispatch.base import (DISPATCHERS, get_dispatcher, padding_waste,
                                  register_dispatcher)
from moejax.dispatch import capacity, dropless, memeff  # registers
