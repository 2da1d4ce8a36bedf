"""Triton kernels, each beside a plain-PyTorch reference that runs on the CPU."""
