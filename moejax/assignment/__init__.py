"""Assignments of tokens to experts, below every part: the Routing a router
returns (routing.py), the row layouts dispatchers and fused expert paths build
from it (layout.py) and the block schedules their loops run over (blocks.py)."""
