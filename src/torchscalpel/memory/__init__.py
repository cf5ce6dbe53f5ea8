"""Memory analysis: where memory goes (category, module, call site), what grows, and why a run ran out.

``scalpel memory`` (docs/memory.md) runs a script under :class:`~torchscalpel.memory.observer.MemoryObserver`;
the function :func:`torchscalpel.memory` (defined in :mod:`torchscalpel.inprocess`) opens the same
accounting around a block of the user's own code. As for the doctor package, ``torchscalpel.memory``
is that function, and this package is reached by import (``from torchscalpel.memory import analysis``).
"""
