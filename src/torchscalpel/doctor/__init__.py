"""The doctor: static and runtime rules that find training-script pitfalls (see docs/doctor.md).

The in-process entry point is the function :func:`torchscalpel.doctor` (defined in
:mod:`torchscalpel.inprocess`); it is bound on the ``torchscalpel`` package after this package is
loaded, so ``torchscalpel.doctor`` is that function and this package is reached by import
(``from torchscalpel.doctor.api import diagnose``), never by attribute.
"""
