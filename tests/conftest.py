"""Shared test settings: CPU only, hypothesis without deadlines (jit compiles)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

settings.register_profile("moejax", deadline=None, print_blob=True)
settings.load_profile("moejax")
