"""The doctor's run window: a step count, with a time cap that is reported when it cut the window short.

Torch-free so the CLI's help can quote it. Findings must not depend on how busy the machine is, so
the window is measured in steps (the same steps on a fast or a loaded machine) and every rule
decides on step counts, per-step event counts or shares measured within the same steps. The time
cap only protects users from a very slow script; when it ends the window before the planned steps,
the run record and the output say so (``sections.doctor.window.capped``).
"""

from torchscalpel.runtime.window import StepWindow

DOCTOR_WINDOW = StepWindow(warmup=2, steps=300)
"""``scalpel doctor`` and ``torchscalpel.doctor``: 300 measured steps (``--steps auto``), so small
scripts reach their evaluation loops, later epochs and checkpoint saves, where many bugs live."""
DEFAULT_STEPS = DOCTOR_WINDOW.steps
"""Measured steps of the default window (``--steps auto``)."""
RANK_STEPS = 30
"""Measured steps of every rank under a launcher (no time cap there: a rank stopped by its own
clock would leave the others blocked in their next collective)."""
TIME_CAP_S = 120.0
"""Default wall-clock cap of a doctor run (``--time-cap``); 0 or None: no cap."""
TAIL_CAP_S = 30.0
"""Default ``--tail-cap``: after a training window ends on its step count, the script runs on for up to this
many seconds under the cheap checks only (the set-up wrappers of torch.save, torch.load, exports: no
profiler, no per-module hooks, no step records), so a save or export at its end is still seen (a script
that trains several folds and saves its best model last). 0 or None: stop at the window's end."""
