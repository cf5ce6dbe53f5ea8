"""Write a finished run where users already look: TensorBoard (``--tensorboard DIR``) and MLflow
(``--mlflow URI``). Both writers are fed from the Run record alone (per-step records and the
summary), after the run; a missing optional dependency costs only that output, in one sentence.
"""

from torchscalpel.tracking.sink import TrackingOptions, write_tracking

__all__ = ["TrackingOptions", "write_tracking"]
