"""Ship: load trained weights into the user's model, export it, prove the export, write a bundle.

``scalpel export`` drives :func:`torchscalpel.ship.export.export_bundle`; ``scalpel serve`` reads
what :mod:`torchscalpel.ship.bundle` wrote.
"""
