"""Tune settings: the knob values a trial applies, and their ``scalpel.toml`` form.

A :class:`TuneSettings` is plain data: every field left at ``None`` means "leave the script as it
is". ``scalpel tune`` writes the winning settings to ``scalpel.toml`` under ``[tune]``;
``scalpel run --config scalpel.toml`` reads them back. The file is small and hand-editable::

    [tune]
    amp = "bf16"
    threads = 2

    [tune.compile]
    target = "Block"
    mode = "default"

    [tune.dataloader]
    num_workers = 2
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from torchscalpel.errors import UsageError
from torchscalpel.fileio import atomic_write_text

if sys.version_info >= (3, 11):  # a version test, not try/except, is what type checkers follow
    import tomllib
else:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib

SETTINGS_VERSION = "1.0"

AMP_DTYPES = ("bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZER_IMPLS = ("foreach", "fused")
KNOB_NAMES: tuple[str, ...] = (
    "amp",
    "threads",
    "dataloader",
    "optimizer",
    "channels_last",
    "matmul",
    "cudnn",
    "compile",
    "checkpointing",
    "microbatch",
)
"""Knob families in search order (``tune.knobs.all_knobs()`` builds them). Kept here, torch-free,
because the CLI parser lists them: every ``scalpel`` command builds that parser."""


def is_module_name(text: object) -> bool:
    """``model``, a class name or a submodule's qualified name (``layers.0``): identifiers joined by
    dots, a list index among them. Nothing else: fix writes a compile target into the user's code (as
    a string), so a record or a config cannot smuggle code in through it."""
    if not isinstance(text, str) or not text:
        return False
    head, *rest = text.split(".")
    return head.isidentifier() and all(part.isidentifier() or part.isdecimal() for part in rest)


def _is_int(value: object) -> bool:
    """An integer, and not a bool (``true`` is no thread count, though Python's bool is an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A refused value as the error shows it: its repr, cut to 40 characters (a record's may be long)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_flag(value: object) -> bool:
    """True, False or left out (None); not 1 or 0, which ``in (None, True, False)`` would let through."""
    return value is None or isinstance(value, bool)


@dataclass(kw_only=True, slots=True)
class CompileSpec:
    """Which part of the model torch.compile wraps, and how."""

    target: str = "model"
    """``model`` (the root module), a submodule's qualified name (``encoder``), or a class name
    (``Block``: every instance of that class, i.e. the repeated blocks as regions)."""
    mode: str = "default"
    """torch.compile mode."""
    dynamic: bool | None = None
    """torch.compile ``dynamic``; ``None`` lets dynamo decide (it marks sizes dynamic on a recompile)."""
    backend: str = "inductor"
    """torch.compile backend (tests use ``aot_eager``)."""
    fullgraph: bool | None = None
    """``None``: try ``fullgraph=True`` first and fall back to graphs with breaks (both reported);
    ``True``: a graph break fails the trial; ``False``: never try fullgraph."""
    use_cache: bool | None = None
    """``False``: set ``model.config.use_cache = False`` on a transformers model in training (its
    forward otherwise builds a key/value cache nobody reads, whose guards recompile the compiled
    model); ``None`` leaves the config alone."""

    def __post_init__(self) -> None:
        if not is_module_name(self.target):
            raise ValueError("compile.target must be 'model', a submodule name or a class name")
        if not isinstance(self.backend, str) or not self.backend.isidentifier():
            raise ValueError("compile.backend must be a backend's name (inductor, aot_eager, ...)")
        if not isinstance(self.mode, str) or self.mode not in COMPILE_MODES:
            raise ValueError(
                f"compile.mode must be one of {', '.join(COMPILE_MODES)}, not {_shown(self.mode)}"
            )
        if not _is_flag(self.dynamic):
            raise ValueError("compile.dynamic must be true, false or left out")
        if not _is_flag(self.fullgraph):
            raise ValueError("compile.fullgraph must be true, false or left out")
        if not _is_flag(self.use_cache):
            raise ValueError("compile.use_cache must be true, false or left out")

    def label(self) -> str:
        """Short text for tables: ``compile(Block)``, ``compile(model, max-autotune)``."""
        extra = "" if self.mode == "default" else f", {self.mode}"
        if self.dynamic is not None:
            extra += f", dynamic={self.dynamic}"
        if self.fullgraph is not None:
            extra += f", fullgraph={self.fullgraph}"
        return f"compile({self.target}{extra})"


@dataclass(kw_only=True, slots=True)
class DataLoaderSpec:
    """DataLoader constructor arguments forced on every DataLoader the script builds."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None

    def __post_init__(self) -> None:
        if self.num_workers is not None and (not _is_int(self.num_workers) or self.num_workers < 0):
            raise ValueError("dataloader.num_workers must be an integer >= 0")
        if self.prefetch_factor is not None and (
            not _is_int(self.prefetch_factor) or self.prefetch_factor < 1
        ):
            raise ValueError("dataloader.prefetch_factor must be an integer >= 1")
        for name in ("pin_memory", "persistent_workers"):
            if not _is_flag(getattr(self, name)):
                raise ValueError(f"dataloader.{name} must be true or false")

    def is_empty(self) -> bool:
        """True when no DataLoader argument is set."""
        return all(getattr(self, f.name) is None for f in fields(self))


@dataclass(kw_only=True, slots=True)
class TuneSettings:
    """One configuration of knobs; ``None`` everywhere is the baseline (the script untouched)."""

    amp: str | None = None
    """Autocast dtype around the model's forward: ``bf16`` (CPU or CUDA) or ``fp16`` (CUDA, with GradScaler)."""
    amp_fp32_attention: bool | None = None
    """With ``amp``: run ``F.scaled_dot_product_attention`` in float32 (its bf16 CPU backward is slow)."""
    compile: CompileSpec | None = None
    """torch.compile of a region of the model."""
    dataloader: DataLoaderSpec = field(default_factory=DataLoaderSpec)
    """DataLoader arguments."""
    matmul_precision: str | None = None
    """``torch.set_float32_matmul_precision`` (``high`` enables TF32 on CUDA)."""
    cudnn_benchmark: bool | None = None
    """``torch.backends.cudnn.benchmark`` (CUDA, static shapes)."""
    optimizer: str | None = None
    """Optimizer implementation: ``foreach`` or ``fused``."""
    channels_last: bool | None = None
    """Convert the model and its 4-D inputs to channels_last memory format (conv nets)."""
    threads: int | None = None
    """``torch.set_num_threads`` (CPU intra-op threads)."""
    checkpointing: str | None = None
    """Activation checkpointing: ``blocks`` (every repeated block, ``torchscalpel.blocks``)."""
    microbatches: int | None = None
    """Split each batch into this many micro-batches with gradient accumulation (>= 2)."""

    def __post_init__(self) -> None:
        if isinstance(self.compile, dict):
            self.compile = CompileSpec(**self.compile)
        if isinstance(self.dataloader, dict):
            self.dataloader = DataLoaderSpec(**self.dataloader)
        if self.compile is not None and not isinstance(self.compile, CompileSpec):
            raise ValueError("compile must be a table (target, mode, dynamic, backend, fullgraph)")
        if self.dataloader is not None and not isinstance(self.dataloader, DataLoaderSpec):
            raise ValueError(
                "dataloader must be a table (num_workers, pin_memory, persistent_workers, prefetch_factor)"
            )
        # Every value is checked against its set before a membership test: an unhashable value (a
        # list in a record) must be refused in a sentence, not raise TypeError.
        if self.amp is not None and (not isinstance(self.amp, str) or self.amp not in AMP_DTYPES):
            raise ValueError(f"amp must be one of {', '.join(AMP_DTYPES)}, not {_shown(self.amp)}")
        if self.matmul_precision is not None and (
            not isinstance(self.matmul_precision, str) or self.matmul_precision not in MATMUL_PRECISIONS
        ):
            raise ValueError(f"matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}")
        if self.optimizer is not None and (
            not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZER_IMPLS
        ):
            raise ValueError(
                f"optimizer must be one of {', '.join(OPTIMIZER_IMPLS)}, not {_shown(self.optimizer)}"
            )
        if self.threads is not None and (not _is_int(self.threads) or self.threads < 1):
            raise ValueError("threads must be an integer >= 1")
        if self.checkpointing is not None and self.checkpointing != "blocks":
            raise ValueError(f'checkpointing must be "blocks", not {_shown(self.checkpointing)}')
        if self.microbatches is not None and (not _is_int(self.microbatches) or self.microbatches < 2):
            raise ValueError("microbatches must be an integer >= 2")
        if self.amp_fp32_attention and self.amp is None:
            raise ValueError("amp_fp32_attention needs amp to be set")
        for name in ("cudnn_benchmark", "channels_last", "amp_fp32_attention"):
            if not _is_flag(getattr(self, name)):
                raise ValueError(f"{name} must be true or false")

    # -- plain data ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Only the fields that are set, nested the way scalpel.toml nests them."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, DataLoaderSpec):
                dl = {k: v for k, v in asdict(value).items() if v is not None}
                if dl:
                    out["dataloader"] = dl
            elif isinstance(value, CompileSpec):
                out["compile"] = {k: v for k, v in asdict(value).items() if v is not None}
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneSettings:
        """Build from :meth:`to_dict` output; unknown keys raise ValueError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown tune setting(s): {', '.join(_shown(k) for k in unknown)} (known: {', '.join(sorted(known))})"
            )
        kwargs = dict(data)
        for key, spec in (("compile", CompileSpec), ("dataloader", DataLoaderSpec)):
            table = kwargs.get(key)
            if isinstance(table, dict):
                names = {f.name for f in fields(spec)}
                extra = sorted(set(table) - names)
                if extra:  # an unknown key inside [tune.compile] / [tune.dataloader]
                    raise ValueError(
                        f"{key} has unknown key(s) {', '.join(_shown(k) for k in extra)} (known: {', '.join(sorted(names))})"
                    )
                kwargs[key] = spec(**table)
        return cls(**kwargs)

    def merged(self, other: TuneSettings) -> TuneSettings:
        """These settings with every field ``other`` sets laid on top (used to combine winners)."""
        data = self.to_dict()
        for key, value in other.to_dict().items():
            if key == "dataloader" and "dataloader" in data:
                data["dataloader"] = {**data["dataloader"], **value}
            else:
                data[key] = value
        return TuneSettings.from_dict(data)

    def is_baseline(self) -> bool:
        """True when nothing is set."""
        return not self.to_dict()

    def label(self) -> str:
        """Short human label: ``baseline`` or ``amp=bf16 + compile(Block) + workers=2``."""
        parts: list[str] = []
        for key, value in self.to_dict().items():
            if key == "compile":
                assert self.compile is not None
                parts.append(self.compile.label())
            elif key == "dataloader":
                parts.extend(f"{k}={v}" for k, v in value.items())
            elif value is True:
                parts.append(key)
            elif value is False:
                parts.append(f"no-{key}")
            else:
                parts.append(f"{key}={value}")
        return " + ".join(parts) or "baseline"


# -- scalpel.toml ---------------------------------------------------------------------------------


def read_settings_file(path: Path) -> TuneSettings:
    """Read ``[tune]`` from a scalpel.toml; raise :class:`UsageError` with one sentence on any problem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"Config file {path} does not exist; run 'scalpel tune' first or pass --config PATH."
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(
            f"{path} is not valid TOML ({exc}); fix the file or re-run 'scalpel tune'."
        ) from None
    version = str(data.get("version", SETTINGS_VERSION))
    if version.split(".")[0] != SETTINGS_VERSION.split(".")[0]:
        raise UsageError(
            f"{path} has settings version {version}; this torchscalpel reads {SETTINGS_VERSION}."
        )
    section = data.get("tune")
    if section is None:
        raise UsageError(f"{path} has no [tune] table; it was not written by 'scalpel tune'.")
    try:
        return TuneSettings.from_dict(section)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}.") from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def settings_to_toml(settings: TuneSettings, *, header: list[str] | None = None) -> str:
    """The scalpel.toml text for ``settings`` (comment lines from ``header`` first)."""
    lines = [f"# {h}" for h in (header or [])]
    lines += [f'version = "{SETTINGS_VERSION}"', "", "[tune]"]
    data = settings.to_dict()
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables.items():
        lines += ["", f"[tune.{key}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_settings_file(settings: TuneSettings, path: Path, *, header: list[str] | None = None) -> Path:
    """Write scalpel.toml (atomically: a crash never leaves half a file)."""
    return atomic_write_text(path, settings_to_toml(settings, header=header))
