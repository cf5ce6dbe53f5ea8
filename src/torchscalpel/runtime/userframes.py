"""Which file, and which frame, is the user's: the one rule behind every ``file:line`` torchscalpel names.

A file is one of :class:`Kind`: the user's own code, or torch, torchscalpel, the standard library,
a third-party package, or code Python generated. The markers are kept here once:

- torch's and torchscalpel's package folders (as imported here, symlinks resolved or not);
- ``site-packages`` / ``dist-packages``: any environment's installed packages;
- the standard library: ``sysconfig``'s ``stdlib`` / ``platstdlib`` folders and ``<frozen ...>`` modules;
- generated code: ``<string>`` (``exec``, dataclass methods) and torch.fx's ``<eval_with_key>.N``.

Names recorded on another machine (a CUDA memory snapshot, an NCCL flight-recorder dump, a stack
dump from another node) do not start with this machine's folders; for those the same markers are
also matched by layout: a ``/lib/pythonX.Y/`` folder is a standard library, and ``/torch/NAME`` or
``/torchscalpel/NAME`` with ``NAME`` one of that package's own top-level entries is that package,
wherever it was installed or built. Nothing matches a bare folder name: a project living under
``lib/python/``, ``torch/`` or a clone named ``torchscalpel`` is still the user's.

:func:`call_site` is the one walk of a live stack that names where a call came from, as a
:class:`Site`: the user's line, the installed package's line on the way there, and whose code made
the call. The sites of constructions and calls (:mod:`~torchscalpel.runtime.sites`), of allocations
(:mod:`~torchscalpel.runtime.alloc_tracker`) and of ops (:mod:`~torchscalpel.runtime.op_lines`)
all read it, each choosing what it names. :func:`user_frame` returns the live frame itself
(innermost first); :func:`first_user` picks from recorded frames. Their options are the deliberate
differences between callers (a fallback when no frame is the user's, a depth limit, Python files
only); :func:`is_runner_file` names the frames that run a script for torchscalpel (ours and
:mod:`runpy`), which tracebacks and stack listings hide.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import os
import re
import sysconfig
from collections.abc import Callable, Collection, Iterable
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class Kind(enum.Enum):
    """Whose code a file is."""

    USER = "user"
    THIRD_PARTY = "third-party"
    STDLIB = "stdlib"
    TORCH = "torch"
    SCALPEL = "torchscalpel"
    GENERATED = "generated"


LIBRARIES = frozenset({Kind.THIRD_PARTY, Kind.STDLIB})
"""A library's line: a fallback for callers that would rather name it than nothing (never torch or ours)."""
ANY = frozenset(Kind)
"""Every kind: a fallback to the innermost frame, whoever's it is."""


def _folders(path: str | None) -> tuple[str, ...]:
    """``path`` as imported and with links resolved, each ending in ``/`` (prefixes, not names)."""
    if not path:
        return ()
    found = {os.path.abspath(path), os.path.realpath(path)}
    return tuple(sorted(f.replace(os.sep, "/").rstrip("/") + "/" for f in found))


def _torch_dir() -> str | None:
    spec = importlib.util.find_spec("torch")  # found without importing torch (hang diagnosis is pure)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return locations[0] if locations else None


def _layout(name: str, folder: str | None) -> str:
    """A pattern for ``/NAME/ENTRY`` with ENTRY one of the package's own top-level entries here."""
    try:
        entries = sorted(
            e
            for e in os.listdir(folder or "")
            if not e.startswith(".") and e != "__pycache__" and e != "example_scripts"
        )  # the bundled examples play the user's part
    except OSError:
        entries = []
    if not entries:
        return r"(?!)"
    alternatives = "|".join(re.escape(e) for e in entries)
    return rf"/{re.escape(name)}/(?:{alternatives})(?:/|$)"


_OUR_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = _torch_dir()
_TORCH_DIRS = _folders(_TORCH)
_OUR_DIRS = _folders(_OUR_PACKAGE)
_STDLIB_DIRS = tuple(
    sorted({d for key in ("stdlib", "platstdlib") for d in _folders(sysconfig.get_paths().get(key))})
)
_TORCH_LAYOUT = re.compile(_layout("torch", _TORCH))
_OUR_LAYOUT = re.compile(_layout("torchscalpel", _OUR_PACKAGE))
# Installed packages, wherever the environment is; site-packages is tested before the stdlib folder it sits in.
_PACKAGES = re.compile(r"/(?:site|dist)-packages/")
# Another machine's standard library (``/usr/lib/python3.10/threading.py``): an exact version folder,
# so a project folder named ``lib/python`` is not taken for it.
_STDLIB_ELSEWHERE = re.compile(r"/lib(?:64)?/python\d+\.\d+t?/")
_GENERATED = ("<string>", "<eval_with_key>")
_RUNPY = ("/runpy.py", "<frozen runpy>")


@functools.lru_cache(maxsize=8192)
def file_kind(path: str) -> Kind:
    """Whose code ``path`` (a frame's file name, live or recorded elsewhere) is."""
    p = path.replace("\\", "/")
    if p.startswith(_TORCH_DIRS):
        return Kind.TORCH
    if p.startswith(_OUR_DIRS):
        return Kind.SCALPEL
    if p.startswith("<"):
        if p.startswith("<frozen "):
            return Kind.STDLIB
        # ``<stdin>``, ``<ipython-input-3-...>`` are a person's code; exec'd and fx code are not.
        return Kind.GENERATED if p.startswith(_GENERATED) else Kind.USER
    if _TORCH_LAYOUT.search(p):
        return Kind.TORCH
    if _OUR_LAYOUT.search(p):
        return Kind.SCALPEL
    if _PACKAGES.search(p):
        return Kind.THIRD_PARTY
    if p.startswith(_STDLIB_DIRS) or _STDLIB_ELSEWHERE.search(p):
        return Kind.STDLIB
    return Kind.USER


def is_user_file(path: str) -> bool:
    """True when ``path`` is the user's own code (not torch, torchscalpel, the stdlib, a package, generated)."""
    return file_kind(path) is Kind.USER


def is_runner_file(path: str) -> bool:
    """True for the frames that run a script for torchscalpel: its own and :mod:`runpy`'s.

    Tracebacks and stack listings leave these out: ``python SCRIPT`` shows none of them, while a
    script run with ``-m`` from an installed package keeps its own (third-party) frames.
    """
    kind = file_kind(path)
    return kind is Kind.SCALPEL or (kind is Kind.STDLIB and path.replace("\\", "/").endswith(_RUNPY))


def user_frame(frame: Any, *, fallback: Collection[Kind] = (), max_depth: int | None = None) -> Any:
    """The innermost live frame at or above ``frame`` (following ``f_back``) that is the user's.

    ``fallback``: kinds whose innermost frame is returned when no frame is the user's (None otherwise);
    ``max_depth``: frames to look at, at most (None: the whole stack).
    """
    spare = None
    depth = 0
    while frame is not None and (max_depth is None or depth < max_depth):
        kind = file_kind(frame.f_code.co_filename)
        if kind is Kind.USER:
            return frame
        if spare is None and kind in fallback:
            spare = frame
        frame = frame.f_back
        depth += 1
    return spare


def first_user(
    frames: Iterable[T],
    filename: Callable[[T], str] = str,
    *,
    fallback: Collection[Kind] = (),
    python_only: bool = False,
) -> T | None:
    """The first of ``frames`` (recorded ones, innermost first) whose file is the user's.

    ``filename`` gives a frame's file name (the frame itself by default: a list of names);
    ``fallback``: kinds whose first frame is returned when none is the user's (None otherwise);
    ``python_only``: only names ending in ``.py`` count, for recordings that mix in native frames
    (a CUDA memory snapshot's C++ frames and its ``??``).
    """
    spare = None
    for frame in frames:
        name = filename(frame)
        if not isinstance(name, str) or not name or (python_only and not name.endswith(".py")):
            continue
        kind = file_kind(name)
        if kind is Kind.USER:
            return frame
        if spare is None and kind in fallback:
            spare = frame
    return spare


def user_site(frame: Any) -> str:
    """``file:line`` of the innermost caller outside torch and torchscalpel (the user's, else a library's:
    Lightning's or the stdlib's line is named when no user frame is on the stack, better than "?")."""
    found = user_frame(frame, fallback=LIBRARIES)
    return "?" if found is None else f"{found.f_code.co_filename}:{found.f_lineno}"


_PATCHING = "/runtime/patching.py"
# The kinds as plain module names for the walk below, which runs at every allocation the memory tracker
# counts and every torch call the op-line pass wraps: reading ``Kind.TORCH`` goes through the enum's class
# (measured several times slower than a module global on Python 3.11), and an enum's hash is a Python
# call, so no set membership either: identity tests on these.
_KIND_USER, _KIND_TORCH, _KIND_SCALPEL = Kind.USER, Kind.TORCH, Kind.SCALPEL
_KIND_STDLIB, _KIND_THIRD_PARTY, _KIND_GENERATED = Kind.STDLIB, Kind.THIRD_PARTY, Kind.GENERATED


def _wrapper_layer(frame: Any) -> bool:
    """True for a layer that :func:`torchscalpel.runtime.patching.wrap_attr` put over a torch function."""
    return frame is not None and frame.f_code.co_filename.replace("\\", "/").endswith(_PATCHING)


class Site(NamedTuple):
    """Where a call on the live stack came from (:func:`call_site`): plain names and numbers, no frames.

    A named tuple, not a frozen dataclass: one is built for every allocation the memory tracker counts
    and every torch call the op-line pass wraps, and a tuple is the cheapest immutable record to build.
    """

    file: str | None = None
    """The user's frame: the innermost one in the user's code (None when no frame is the user's)."""
    line: int = 0
    library_file: str | None = None
    """The innermost installed package's frame (:attr:`Kind.THIRD_PARTY`) between the call and the
    user's frame, or anywhere on the stack when no frame is the user's (None when there is none)."""
    library_line: int = 0
    caller: Kind | None = None
    """Whose code made the call: the kind of the innermost frame that is not torch's, the standard
    library's or generated code. None when there is none, or when that frame is torchscalpel's layer over
    a torch function (``runtime/patching.py``) or the hook the layer calls: those pass a call through."""

    @property
    def user(self) -> str | None:
        """``file:line`` of the user's frame, or None."""
        return None if self.file is None else f"{self.file}:{self.line}"

    @property
    def library(self) -> str | None:
        """``file:line`` of the installed package's frame, or None."""
        return None if self.library_file is None else f"{self.library_file}:{self.library_line}"


NO_SITE = Site()
"""The site of a call with no Python caller."""


def call_site(frame: Any, *, skip_self: object = None) -> Site:
    """Where the call made in ``frame`` came from: one walk outwards (``f_back``) to the user's frame.

    ``skip_self``: an object whose own methods are passed over (a frame whose ``self`` is it: the
    constructor chain of the object being built, a user's subclass calling ``super().__init__()``).
    """
    caller: Kind | None = None
    decided = False
    library = None
    while frame is not None:
        code = frame.f_code
        kind = file_kind(code.co_filename)
        if (
            skip_self is not None
            and kind is not _KIND_TORCH
            and kind is not _KIND_SCALPEL
            and frame.f_locals.get("self") is skip_self
        ):
            frame = frame.f_back
            continue
        # torch's, the standard library's and generated code's frames never make a call in their own name
        if (
            not decided
            and kind is not _KIND_TORCH
            and kind is not _KIND_STDLIB
            and kind is not _KIND_GENERATED
        ):
            decided = True
            passed_through = kind is _KIND_SCALPEL and (_wrapper_layer(frame) or _wrapper_layer(frame.f_back))
            caller = None if passed_through else kind
        if kind is _KIND_USER:
            return Site(
                file=code.co_filename,
                line=frame.f_lineno,
                library_file=None if library is None else library[0],
                library_line=0 if library is None else library[1],
                caller=caller,
            )
        if library is None and kind is _KIND_THIRD_PARTY:
            library = (code.co_filename, frame.f_lineno)
        frame = frame.f_back
    if library is None:
        return Site(caller=caller)
    return Site(library_file=library[0], library_line=library[1], caller=caller)
