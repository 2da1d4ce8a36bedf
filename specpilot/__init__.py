"""SpecPilot: a git-native patch-and-memory manager for speculative-decoding optimizations."""

__version__ = "0.1.0"
