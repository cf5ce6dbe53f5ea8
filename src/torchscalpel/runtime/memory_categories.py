"""The memory categories every byte is filed under, in print order: torch-free, so that rendering a memory
report (``report/memory_*``) does not import torch for one tuple."""

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
"""Every category, in the order the breakdown prints them (allocator cache is added on CUDA)."""
