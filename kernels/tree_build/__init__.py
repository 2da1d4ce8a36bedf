"""The best-first draft tree built on the device from a packed draft lattice: a one-program
Triton kernel (build.py) and its plain-PyTorch reference (reference.py)."""

from kernels.tree_build.build import tree_build
from kernels.tree_build.reference import reference_tree_build

__all__ = ["reference_tree_build", "tree_build"]
