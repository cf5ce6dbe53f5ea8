"""Attach to an unmodified script in-process and time every step through PyTorch's global hooks."""
