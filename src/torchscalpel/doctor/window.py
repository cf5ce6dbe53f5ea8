"""The doctor's default run window (``--steps auto``); torch-free so the CLI's help can quote it."""

DEFAULT_STEPS = 30
"""Measured steps the doctor run always gets (plus warm-up), when the script has that many."""
AUTO_MAX_STEPS = 300
"""With the default window, the run continues past DEFAULT_STEPS up to this many steps ..."""
AUTO_SECONDS = 20.0
"""... while it has run for less than this long: small scripts get to their evaluation loops and
later epochs (where many bugs live), large ones stop after DEFAULT_STEPS."""
