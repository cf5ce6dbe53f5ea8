"""Rule modules: ``<family>_static.py`` (AST rules) and ``rt_<family>.py`` (runtime rules).

Importing them registers nothing; the one list of rule classes is :mod:`torchscalpel.doctor.catalogue`.
"""
