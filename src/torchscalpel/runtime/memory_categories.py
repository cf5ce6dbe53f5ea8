"""The memory categories every byte is filed under, in print order: torch-free, so that rendering a memory
report (``report/memory_*``) does not import torch for one tuple."""

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
"""Every category, in the order the breakdown prints them (allocator cache is added on CUDA)."""

BEFORE_TRAINING = "before training"
"""The phase of everything allocated before the model's first training forward (and before any evaluation)."""

EVALUATION = "evaluation"
"""The phase from a root forward without grad (``torch.no_grad()`` evaluation) to the next training event."""
