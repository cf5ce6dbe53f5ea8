"""The editors of ``scalpel fix``, one module per family of edit kinds; :mod:`torchscalpel.fix.edits`
maps each kind to its editor. An editor takes the parsed module, its metadata wrapper and the
:class:`~torchscalpel.fix.cst.Edit`, and returns the edited module, None when the code already does it,
or raises :class:`~torchscalpel.fix.cst.EditError` (``not patched``)."""
