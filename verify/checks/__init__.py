"""The applier-side checks; importing this package registers them, in the order `applier verify` runs them."""
from . import resolution, reach, integrity, effects, kernels  # noqa: F401
