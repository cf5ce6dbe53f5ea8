"""The one list of doctor rule classes, static and runtime, in documentation order.

Adding a rule means writing its class (with its :class:`~torchscalpel.doctor.rule.RuleInfo`, from
which the rule builds its own findings) and listing it here; nothing registers itself on import. The
catalogue sits above the rule modules and only collects them: no rule imports it (nor
:mod:`~torchscalpel.doctor.registry`, above it), so the doctor's modules form no import cycle. :data:`RULES` (re-exported as
``torchscalpel.doctor.registry.RULES``) is derived from these classes: every slug once, in the order
its first class appears below, which is the order findings are ranked in and SARIF lists rules in.
``tests/unit/test_doctor_catalogue.py`` fails for a rule class that is missing here or lacks metadata.
"""

from __future__ import annotations

from torchscalpel.doctor.rule import Rule, RuleInfo
from torchscalpel.doctor.rules import (
    accum_static,
    checkpoint_static,
    dist_static,
    fsdp_static,
    loop_static,
    model_static,
    rt_amp,
    rt_batch_values,
    rt_checkpoint,
    rt_data,
    rt_dist,
    rt_dist_accum,
    rt_eval_curve,
    rt_grads,
    rt_graph,
    rt_label_range,
    rt_loss,
    rt_model,
    rt_numerics,
    rt_optim,
    rt_other,
    rt_perf,
    rt_run,
    rt_schedule,
    rt_train_in_eval,
    schedule_static,
)
from torchscalpel.doctor.runtime_rules import RuntimeRule
from torchscalpel.doctor.sanity import OverfitOneBatch
from torchscalpel.doctor.static import StaticRule

RULE_CLASSES: tuple[type[Rule], ...] = (
    # The run
    rt_run.ScriptFailed,
    # Model and parameters
    model_static.ModuleInPlainContainerStatic,
    rt_model.ModuleInPlainContainer,
    model_static.TensorAttributeNotRegisteredStatic,
    rt_model.TensorAttributeNotRegistered,
    model_static.ModuleCreatedInForwardStatic,
    rt_model.ModuleCreatedInForward,
    model_static.SuperInitMissingStatic,
    rt_optim.ParamNotInOptimizer,
    rt_optim.FrozenParamInOptimizer,
    # Training loop
    rt_optim.GradNotZeroed,
    loop_static.ManualParameterUpdateStatic,
    rt_optim.ManualParameterUpdate,
    rt_graph.LossGraphRetained,
    rt_graph.EvalInTrainMode,
    rt_graph.EvalWithoutNoGrad,
    rt_train_in_eval.TrainInEvalMode,
    rt_data.TrainLoaderNotShuffled,
    rt_loss.SoftmaxBeforeCrossEntropy,
    rt_loss.LossTaskMismatch,
    accum_static.AccumulatedLossNotDividedStatic,
    # Data
    rt_batch_values.BatchValues,
    rt_label_range.LabelChecks,
    # Numerics
    rt_numerics.NanLoss,
    rt_numerics.LossDiverging,
    rt_numerics.ConstantLoss,
    rt_grads.GradNorms,
    rt_grads.NoUpdate,
    OverfitOneBatch,
    rt_eval_curve.EvalCurve,
    schedule_static.NoLrWarmupStatic,
    rt_schedule.NoLrWarmup,
    # Mixed precision
    rt_amp.ClipBeforeUnscale,
    rt_amp.ScalerSkippedSteps,
    # Performance
    rt_data.DataloaderBound,
    rt_other.OtherPhaseHeavy,
    rt_perf.HostDeviceCopyBound,
    loop_static.EmptyCacheInLoopStatic,
    rt_perf.EmptyCacheInLoop,
    rt_perf.CudnnBenchmarkDynamicShapes,
    loop_static.CudnnDisabledStatic,
    rt_perf.CompileRules,
    # Distributed
    rt_dist.DdpBatchnormNotSynced,
    rt_dist.DdpDataRules,
    dist_static.SamplerSetEpochMissingStatic,
    dist_static.SamplerNumReplicasStatic,
    rt_dist_accum.SamplerNumReplicas,
    rt_dist.DdpFindUnusedParameters,
    accum_static.DdpAccumWithoutNoSyncStatic,
    rt_dist_accum.DdpAccumWithoutNoSync,
    dist_static.RankConditionalStepStatic,  # its runtime half is the --nproc comparison in doctor/ranks.py
    dist_static.DataParallelUsedStatic,
    rt_dist.DataParallelUsed,
    fsdp_static.OptimizerBeforeFsdpStatic,
    rt_dist.OptimizerBeforeFsdp,
    fsdp_static.ClipOnFsdp1WrapperStatic,
    fsdp_static.FsdpFp16PlainScalerStatic,
    fsdp_static.FsdpLowPrecisionMasterStatic,
    fsdp_static.FsdpCpuOffloadStatic,
    dist_static.DdpDeviceIdsStatic,
    # Checkpoints
    checkpoint_static.UnsafeTorchLoadStatic,
    checkpoint_static.WholeModelSaveStatic,
    rt_checkpoint.CheckpointRules,
    # Reproducibility
    loop_static.UnseededRunStatic,
    rt_checkpoint.UnseededRun,
)
"""Every rule class, in documentation order."""

SANITY_RULES: tuple[type[RuntimeRule], ...] = (OverfitOneBatch,)
"""Runtime rules of the ``--sanity`` re-run only (not part of the main run)."""

STATIC_RULES: tuple[type[StaticRule], ...] = tuple(c for c in RULE_CLASSES if issubclass(c, StaticRule))
"""The static rules, run over every parsed file in this order."""

RUNTIME_RULES: tuple[type[RuntimeRule], ...] = tuple(
    c for c in RULE_CLASSES if issubclass(c, RuntimeRule) and c not in SANITY_RULES
)
"""The runtime rules of a doctor run, dispatched in this order."""


def _rule_table() -> dict[str, RuleInfo]:
    table: dict[str, RuleInfo] = {}
    for cls in RULE_CLASSES:
        for info in cls.infos:
            table.setdefault(info.slug, info)
    return table


RULES: dict[str, RuleInfo] = _rule_table()
"""All rules by slug, in documentation order."""


def runtime_rules() -> list[RuntimeRule]:
    """One fresh instance of every runtime rule of the main run."""
    return [cls() for cls in RUNTIME_RULES]


def static_rules() -> list[StaticRule]:
    """One instance of every static rule."""
    return [cls() for cls in STATIC_RULES]
