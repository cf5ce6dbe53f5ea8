"""What ``scalpel plan`` and ``torchscalpel.plan`` ask for: one options class for both ways to name the model.

A plan takes the model, its batch and its optimizer either from a script's first training step (``target``:
``scalpel plan -- SCRIPT``) or from a factory (``model``: ``--model MODULE:FACTORY`` on the command line, a
callable in process, with ``batch`` in the ``--batch`` grammar). Everything else (strategies, world, device,
precision, accumulation) reads the same in both. Torch-free: the CLI builds the options before torch loads.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscalpel.errors import ArgumentError
from torchscalpel.options import StageOptions

if TYPE_CHECKING:
    from torchscalpel.runtime.target import Target

SINGLE_RANK_ONLY = ("ddp", "fsdp-full", "fsdp-grad-op")
"""Strategies that need two ranks or more (``single`` is the one-rank plan)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanOptions(StageOptions):
    """One plan: the model (a script's or a factory's) and what to plan it for."""

    target: Target | None = None
    """The script (or ``-m`` module) whose first optimizer step shows the model, batch and optimizer."""
    model: str | Callable[..., Any] | None = None
    """``--model``: a ``MODULE:FACTORY`` reference, or (in process) the factory itself; built on fake tensors."""
    factory_args: str | None = None
    """``--factory-args``: keyword arguments for a ``MODULE:FACTORY`` factory, a JSON object."""
    batch: str | None = None
    """``--batch``: the per-rank batch of a factory's model, e.g. ``x=float32[8,3,32,32],y=int64[8]:10``."""
    loss: str | Callable[..., Any] | None = None
    """``--loss``: ``MODULE:FN`` (or the function) computing ``FN(model, batch)``; default: from the output."""
    optimizer: str | None = None
    """``--optimizer``; None: adamw for a factory, the script's own (or none) for a script."""
    precision: str = "fp32"
    """``--precision``; with a script, fp32 means "as the script ran" (autocast seen in the forward is kept)."""
    strategy: str = "all"
    """``--strategy``: one strategy, or ``all`` that make sense for the world size."""
    world_size: int = 1
    nodes: int = 1
    grad_accum: int = 1
    """``--grad-accum``; with a script, 1 means "as the script ran" (its backward calls per optimizer step)."""
    checkpointing: str = "none"
    """``--activation-checkpointing``: none, or ``blocks`` (block-level checkpointing assumed by the rows)."""
    device: str | None = None
    """``--device``: a name from the device table; neither this nor ``device_memory``: this machine."""
    device_memory: str | None = None
    """``--device-memory``: the target's memory, e.g. ``80GiB``."""
    search_max_batch: bool = True
    """Search the largest batch per strategy (``--no-max-batch`` skips it; minutes on a large model)."""
    out_dir: Path | None = None
    """Where run.json and report.html go (None: nothing is saved, the in-process default)."""
    json_path: Path | None = None
    """``--json``: the plan section also written here."""
    quiet: bool = True
    """No progress while it plans (the in-process default; the CLI draws a bar, then prints the table)."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ArgumentError(f"{{world_size}} {self.world_size} must be at least 1")
        if self.nodes < 1 or self.world_size % self.nodes:
            raise ArgumentError(
                f"{{nodes}} {self.nodes} must be at least 1 and divide {{world_size}} {self.world_size}"
            )
        if self.grad_accum < 1:
            raise ArgumentError(f"{{grad_accum}} {self.grad_accum} must be at least 1")
        if self.strategy == "fsdp-hybrid" and self.nodes < 2:
            raise ArgumentError(
                "{strategy} fsdp-hybrid shards within a node and replicates across nodes; give {nodes} 2 or more"
            )
        if self.strategy in SINGLE_RANK_ONLY and self.world_size < 2:
            raise ArgumentError(
                f"{{strategy}} {self.strategy} needs {{world_size}} 2 or more; use {{strategy}} single for one rank"
            )
        script = self.target is not None
        if script and (self.model is not None or self.batch):
            raise ArgumentError("Give either {model}/{batch} (factory mode) or a script after --, not both")
        if not script and self.model is None:
            raise ArgumentError(
                "Name the script after --, e.g. 'scalpel plan -- train.py', or the model with {model} "
                "MODULE:FACTORY and {batch} SPEC"
            )
        if not script and not self.batch:
            raise ArgumentError(
                "Factory mode needs {batch}, e.g. {batch} 'x=float32[8,3,32,32],y=int64[8]:10'"
            )

    @property
    def name(self) -> str:
        """The plan's name (its run folder's): the script's stem, or the factory's name."""
        if self.target is not None:
            return self.target.name
        if isinstance(self.model, str):
            return self.model.rsplit(":", 1)[-1]
        return str(getattr(self.model, "__qualname__", "model"))

    @property
    def model_name(self) -> str:
        """How the plan names a factory's model: the ``--model`` reference as typed, or the factory's name."""
        return self.model if isinstance(self.model, str) else self.name

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> PlanOptions:
        """What ``scalpel plan``'s parsed flags ask for (``fields``: those the command line does not hold): the
        script after ``--`` resolved, and without ``--out`` a run folder named after it (under the config
        file's ``out_root``)."""
        from torchscalpel.fileio import default_run_dir
        from torchscalpel.runtime.target import target_from_args

        if "target" not in fields and (args.module or [a for a in (args.target or []) if a != "--"]):
            fields["target"] = target_from_args(args)
        options = cls(
            model=args.model,
            factory_args=args.factory_args,
            batch=args.batch,
            loss=args.loss,
            optimizer=args.optimizer,
            precision=args.precision,
            strategy=args.strategy,
            world_size=args.world_size,
            nodes=args.nodes,
            grad_accum=args.grad_accum,
            checkpointing=args.activation_checkpointing,
            device=args.device,
            device_memory=args.device_memory,
            search_max_batch=not args.no_max_batch,
            out_dir=Path(args.out) if args.out else None,
            json_path=Path(args.json_path) if args.json_path else None,
            **fields,
        )
        if options.out_dir is None:
            options = options.replace(
                out_dir=default_run_dir(f"plan-{options.name}", getattr(args, "out_root", None))
            )
        return options
