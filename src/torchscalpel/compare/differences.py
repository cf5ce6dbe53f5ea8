"""Recorded differences between two runs: environment, configuration and tune settings, code, data, seeds.

Each difference is a :class:`Difference` with a ``kind`` (the group it belongs to), a ``key`` in the
words a user would search for (``torch``, ``tune.amp``, ``script args``, ``seed (torch)``) and the two
values. Facts that change between any two runs (load average, run folder, timestamps) are left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchscalpel.record import RunRecord

KINDS = ("config", "tune", "code", "data", "seeds", "environment")
"""Difference groups, in the order a verdict names them."""

VOLATILE_ENV = (
    "cpu.load_avg_1m",
    "executable",
    "driver.nvidia_smi",
    "gpus.*.memory_used",
    "gpus.*.utilization",
)
"""Environment facts that differ between any two runs on the same machine."""

IGNORED_CONFIG = ("tune_settings", "settings_file", "tune_applied", "stopped_by")
"""Config keys compared elsewhere (as tune settings) or not at all (where the settings file lay; what ended
the run, an outcome of the run window compared beside it: two runs of 8 and 20 steps listed their
``{"kind": "steps", "reason": ...}`` as a third difference)."""


@dataclass(kw_only=True, slots=True)
class Difference:
    """One recorded fact that differs between the baseline and another run."""

    kind: str
    key: str
    a: Any
    b: Any
    ran: bool = True
    """False for a difference that touched nothing the runs executed: a git commit, branch or uncommitted diff
    that changed neither the script's hash nor any hash of a module it imported. Listed, never blamed."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (``ran`` only where it is False: what touched nothing that ran)."""
        data = asdict(self)
        if self.ran:
            del data["ran"]
        return data

    def phrase(self) -> str:
        """``torch 2.12 -> 2.13``; a hash is cut to 10 characters; an absent value reads ``(none)``."""
        return f"{self.key} {_short(self.a)} -> {_short(self.b)}"


def _short(value: Any) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return "(none)"
    if isinstance(value, str) and len(value) >= 40 and all(c in "0123456789abcdef" for c in value):
        return value[:10]
    text = value if isinstance(value, str) else _compact(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _compact(value: Any) -> str:
    import json

    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except TypeError:
        return str(value)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a.b.c`` keys; lists of scalars kept whole, lists of dicts indexed."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{i}."))
    else:
        out[prefix.rstrip(".")] = data
    return out


def _volatile(key: str) -> bool:
    import fnmatch

    return any(fnmatch.fnmatch(key, pattern) for pattern in VOLATILE_ENV)


def _env_label(key: str) -> str:
    """``packages.numpy`` reads ``numpy``; ``driver.nvidia_version`` reads ``driver``; others as stored."""
    if key.startswith("packages."):
        return key.removeprefix("packages.")
    return {
        "driver.nvidia_version": "driver",
        "driver.cuda_version": "CUDA driver API",
        "torch_cuda": "CUDA",
        "torch_hip": "ROCm",
        "torch_build.cudnn": "cuDNN",
        "torch_build.nccl": "NCCL",
    }.get(key, key)


def _dict_diff(kind: str, a: dict[str, Any], b: dict[str, Any], *, label: Any = None) -> list[Difference]:
    out = []
    for key in list(dict.fromkeys([*a, *b])):
        if a.get(key) != b.get(key):
            out.append(Difference(kind=kind, key=label(key) if label else key, a=a.get(key), b=b.get(key)))
    return out


def environment_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """torch, CUDA, driver, library versions, CPU, env variables: every stable fact that changed."""
    fa = {k: v for k, v in flatten(a.environment).items() if not _volatile(k)}
    fb = {k: v for k, v in flatten(b.environment).items() if not _volatile(k)}
    # ``torch`` and ``packages.torch`` hold the same version: name it once.
    for env in (fa, fb):
        if "torch" in fa or "torch" in fb:
            env.pop("packages.torch", None)
    return _dict_diff("environment", fa, fb, label=_env_label)


def applied_settings(record: RunRecord) -> dict[str, Any]:
    """The tune settings this run was made with: ``profile --config``'s, a tune trial's, else {}."""
    settings = record.config.get("tune_settings")
    if isinstance(settings, dict):
        return settings
    trial = record.sections.get("trial")
    if isinstance(trial, dict) and isinstance(trial.get("settings"), dict):
        return trial["settings"]
    return {}


def config_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """The run window, other config keys, the script (or module) and its arguments."""
    ca = {k: v for k, v in a.config.items() if k not in IGNORED_CONFIG}
    cb = {k: v for k, v in b.config.items() if k not in IGNORED_CONFIG}
    diffs = _dict_diff("config", ca, cb)
    for key, label in (("script", "script"), ("module", "module"), ("args", "script args")):
        va, vb = a.target.get(key), b.target.get(key)
        if key == "args" and va != vb:
            diffs.extend(_args_differences(list(va or []), list(vb or [])))
        elif va != vb:
            diffs.append(Difference(kind="config", key=label, a=va, b=vb))
    if a.step_kind != b.step_kind:
        diffs.append(Difference(kind="config", key="step kind", a=a.step_kind, b=b.step_kind))
    return diffs


def _args_differences(a: list[str], b: list[str]) -> list[Difference]:
    """``--width 16 -> 64`` when the arguments are ``--flag value`` pairs that differ in values only."""
    pa, pb = _pairs(a), _pairs(b)
    if pa is not None and pb is not None:
        return _dict_diff("config", pa, pb)
    return [Difference(kind="config", key="script args", a=" ".join(a), b=" ".join(b))]


def _pairs(args: list[str]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("-"):
            return None
        if "=" in flag:
            name, value = flag.split("=", 1)
            out[name] = value
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[flag] = args[i + 1]
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def tune_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """The tune settings applied to each run (``tune.amp``, ``tune.compile.target``, ...)."""
    fa = {f"tune.{k}": v for k, v in flatten(applied_settings(a)).items() if v is not None}
    fb = {f"tune.{k}": v for k, v in flatten(applied_settings(b)).items() if v is not None}
    return _dict_diff("tune", fa, fb)


def code_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """Commit, uncommitted diff, the script's hash and each local module's (only where both recorded).

    A commit, branch or uncommitted diff that differs while the script's hash and every imported module's are
    recorded and equal changed no file the runs executed: it is listed with ``ran=False``, never blamed."""
    ca, cb = a.provenance, b.provenance
    if not ca or not cb:
        return []
    diffs = []
    code_a, code_b = ca.get("code") or {}, cb.get("code") or {}
    same_files = _same_files(code_a, code_b)
    ga, gb = ca.get("git") or {}, cb.get("git") or {}
    for key, label in (
        ("commit", "git commit"),
        ("branch", "git branch"),
        ("diff_sha256", "uncommitted diff"),
    ):
        if (ga or gb) and ga.get(key) != gb.get(key):
            diffs.append(Difference(kind="code", key=label, a=ga.get(key), b=gb.get(key), ran=not same_files))
    sa, sb = code_a.get("script") or {}, code_b.get("script") or {}
    if sa.get("sha256") != sb.get("sha256"):
        diffs.append(
            Difference(
                kind="code",
                key=f"script {sb.get('path') or sa.get('path') or ''} hash".replace("  ", " "),
                a=sa.get("sha256"),
                b=sb.get("sha256"),
            )
        )
    ma, mb = code_a.get("modules") or {}, code_b.get("modules") or {}
    for name in list(dict.fromkeys([*ma, *mb])):
        ha, hb = (ma.get(name) or {}).get("sha256"), (mb.get(name) or {}).get("sha256")
        if ha != hb:
            diffs.append(Difference(kind="code", key=f"module {name} hash", a=ha, b=hb))
    return diffs


def _same_files(code_a: dict[str, Any], code_b: dict[str, Any]) -> bool:
    """True when both records hash the script and it is unchanged, and every module either imported has the
    same hash in both: the files that ran are the same whatever the repository's commit says."""
    sa, sb = code_a.get("script") or {}, code_b.get("script") or {}
    if not sa.get("sha256") or sa.get("sha256") != sb.get("sha256"):
        return False
    ma, mb = code_a.get("modules"), code_b.get("modules")
    if not isinstance(ma, dict) or not isinstance(mb, dict) or set(ma) != set(mb):
        return False
    return all((ma[n] or {}).get("sha256") == (mb[n] or {}).get("sha256") for n in ma)


def data_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """The first batch's fingerprint: dataset length, shapes, dtypes, content hash."""
    da, db = (a.provenance or {}).get("data"), (b.provenance or {}).get("data")
    if not da or not db:
        return []
    out = []
    for key, label in (
        ("dataset_len", "dataset length"),
        ("shapes", "first batch shapes"),
        ("dtypes", "first batch dtypes"),
        ("sha256", "first batch content hash"),
    ):
        if da.get(key) != db.get(key):
            out.append(Difference(kind="data", key=label, a=da.get(key), b=db.get(key)))
    return out


def seed_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """Seeds the scripts set (per source, the last value), the torch initial seed, loader generators."""
    sa, sb = (a.provenance or {}).get("seeds"), (b.provenance or {}).get("seeds")
    if not sa or not sb:
        return []

    def last(calls: list[dict[str, Any]]) -> dict[str, Any]:
        return {f"seed ({c.get('source')})": c.get("seed") for c in calls}

    out = _dict_diff("seeds", last(sa.get("calls") or []), last(sb.get("calls") or []))
    if len(out) > 1 and len({(repr(d.a), repr(d.b)) for d in out}) == 1:
        # torch.manual_seed(s) and random.seed(s) from one --seed flag: one difference, not three.
        sources = ", ".join(d.key.removeprefix("seed (").removesuffix(")") for d in out)
        out = [Difference(kind="seeds", key=f"seed ({sources})", a=out[0].a, b=out[0].b)]
    if not out and sa.get("torch_initial_seed") != sb.get("torch_initial_seed"):
        out.append(
            Difference(
                kind="seeds",
                key="torch initial seed",
                a=sa.get("torch_initial_seed"),
                b=sb.get("torch_initial_seed"),
            )
        )
    la = [x.get("generator_seed") for x in sa.get("loaders") or []]
    lb = [x.get("generator_seed") for x in sb.get("loaders") or []]
    if la != lb:
        out.append(Difference(kind="seeds", key="DataLoader generator seeds", a=la, b=lb))
    return out


def all_differences(a: RunRecord, b: RunRecord) -> list[Difference]:
    """Every recorded difference, grouped in :data:`KINDS` order."""
    return [
        *config_differences(a, b),
        *tune_differences(a, b),
        *code_differences(a, b),
        *data_differences(a, b),
        *seed_differences(a, b),
        *environment_differences(a, b),
    ]
