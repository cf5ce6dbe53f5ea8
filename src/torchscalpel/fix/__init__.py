"""``scalpel fix``: the measured change as a patch to the user's own code (docs/fix.md).

The package imports nothing when it loads (``import torchscalpel`` loads it, and every ``scalpel`` command
imports ``torchscalpel``): the entry point is :func:`torchscalpel.stages.fix.run` (``torchscalpel.fix(...)``
in process), over :mod:`torchscalpel.fix.stage`; the options are :class:`torchscalpel.fix.options.FixOptions`.
"""
