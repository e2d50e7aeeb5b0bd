"""Model merging: task arithmetic, TIES, weight averaging and merging experts inside
a layer, as registered merge methods over parameter trees (moejax/merging/base.py).
Every module of the package is imported, so a file that registers a method is all
a new method needs."""

from moejax.merging.base import MERGE_METHODS, Merge, bind, check_simplex
from moejax.registry import import_package_modules

import_package_modules(__name__, __path__)

__all__ = ["MERGE_METHODS", "Merge", "bind", "check_simplex"]
