"""Rule modules. Importing this package registers every static check (runtime rules are listed in
:mod:`torchscalpel.doctor.runtime_rules`)."""

from torchscalpel.doctor.rules import (  # noqa: F401 - imported for their registrations
    checkpoint_static,
    dist_static,
    loop_static,
    model_static,
)
