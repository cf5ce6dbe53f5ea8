"""Request bodies to arrays, validated against the manifest before the model sees them.

Two body types: JSON ``{"inputs": {"x": [[...]]}}`` (or ``{"inputs": [[...]]}`` for one input) and
a raw ``.npy`` file (one input). Every check answers 422 with the reason: wrong rank, shape, dtype,
batch over the limit, non-finite floats, integers outside the exported range, object arrays.
The ``.npy`` header is checked before any data is touched, so a header that claims a huge or
negative shape costs nothing.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchscalpel.serve.errors import RequestError
from torchscalpel.ship.preprocess import PreprocessError, Preprocessor
from torchscalpel.ship.textprep import RAW_FIELD, TextPreprocessor

AnyPreprocessor = Preprocessor | TextPreprocessor
"""An image/tensor spec's preprocessor or a text spec's tokenizer."""

try:
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - the stdlib parser is the fallback
    _msgspec = None  # type: ignore[assignment]

NPY_TYPES = ("application/x-npy", "application/octet-stream")
JSON_TYPES = ("application/json",)


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One model input as the manifest describes it."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]
    """``None`` marks a dynamic dim (the batch)."""
    low: int | None = None
    high: int | None = None
    bounds: tuple[int | None, ...] = ()
    """Per dimension: the largest size of a dynamic dimension besides the batch (its named axis's max)."""
    examples: tuple[int | None, ...] = ()
    """Per dimension: the example size of such a dimension (the warm-up call's shape)."""

    @classmethod
    def from_manifest(
        cls, entry: dict[str, Any], axes: dict[str, tuple[int, int]] | None = None
    ) -> InputSpec:
        """Build from a manifest ``inputs`` entry and the manifest's named axes (``bundle.axis_bounds``)."""
        lo_hi = entry.get("range") or (None, None)
        named = entry.get("dynamic_dims") or {}
        axes = axes or {}
        shape = tuple(entry["shape"])
        found = [
            axes.get(named.get(str(d), "")) if d and dim is None else None for d, dim in enumerate(shape)
        ]
        return cls(
            name=entry["name"],
            dtype=np.dtype(entry["dtype"]),
            shape=shape,
            low=lo_hi[0],
            high=lo_hi[1],
            bounds=tuple(f[0] if f else None for f in found),
            examples=tuple(f[1] if f else None for f in found),
        )

    def bound(self, dim: int) -> int | None:
        """The largest size dimension ``dim`` (not the batch) may have: fixed, or its axis's max."""
        fixed = self.shape[dim]
        if fixed is not None:
            return fixed
        return self.bounds[dim] if dim < len(self.bounds) else None

    def warm_shape(self, rows: int) -> tuple[int, ...]:
        """A valid shape with ``rows`` rows: fixed dims as they are, dynamic ones at their example size."""
        dims = [rows]
        for d, fixed in enumerate(self.shape[1:], start=1):
            example = self.examples[d] if d < len(self.examples) else None
            dims.append(fixed if fixed is not None else example or 1)
        return tuple(dims)


BODY_SLACK = 64 << 10
"""Bytes a body may hold beyond its numbers: the JSON around them, names, whitespace, a .npy header."""
DEFAULT_MAX_BODY = 10 << 20
"""The body cap when the manifest cannot bound a request (a dynamic dimension besides the batch)."""


def _number_text(dtype: np.dtype) -> int:
    """The longest text one JSON number of ``dtype`` takes as Python or JavaScript print it, plus ``, ``."""
    if dtype.kind == "f":
        return 24 + 2  # "-2.2250738585072014e-308"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return max(len(str(info.min)), len(str(info.max))) + 2
    return 5 + 2  # "false"


def body_cap(specs: list[InputSpec], max_rows: int) -> int | None:
    """The largest body a valid request can need: ``max_rows`` rows of every input, as JSON or ``.npy``.

    Per element the longest number's text, its separator, and the brackets, line break and indentation of a
    pretty-printed array (2 characters a level); ``None`` when a dimension besides the batch is dynamic.
    """
    per_row_json = per_row_npy = 0
    for spec in specs:
        dims = [spec.bound(d) for d in range(1, len(spec.shape))]
        if any(d is None for d in dims):
            return None
        elements = math.prod(dims)  # type: ignore[arg-type]
        per_row_json += elements * (_number_text(spec.dtype) + 2 * len(spec.shape) + 8)
        per_row_npy += elements * spec.dtype.itemsize
    return max_rows * max(per_row_json, per_row_npy) + BODY_SLACK


def _fail(reason: str) -> RequestError:
    return RequestError(422, reason)


_ADDRESS = re.compile(r"<[^<>]{0,80}? at 0x[0-9a-fA-F]+>|0x[0-9a-fA-F]{6,}")


def _clean(exc: BaseException) -> str:
    """A parser's message fit to send back: no object reprs or memory addresses, at most 120 characters."""
    return _ADDRESS.sub("<expression>", str(exc))[:120]


def check_array(arr: np.ndarray, spec: InputSpec, max_batch: int) -> np.ndarray:
    """Check shape, dtype and values against ``spec``; return a contiguous array of the right dtype."""
    if arr.ndim != len(spec.shape):
        raise _fail(
            f"input {spec.name!r} has {arr.ndim} dimensions; expected {len(spec.shape)} (batch first)"
        )
    for dim, (got, want) in enumerate(zip(arr.shape, spec.shape, strict=True)):
        if want is not None and got != want:
            raise _fail(f"input {spec.name!r} has size {got} in dimension {dim}; expected {want}")
        top = spec.bound(dim) if dim else None
        if want is None and dim and (got < 1 or (top is not None and got > top)):
            raise _fail(f"input {spec.name!r} has size {got} in dimension {dim}; expected 1 to {top}")
    batch = arr.shape[0]
    if batch < 1:
        raise _fail(f"input {spec.name!r} has an empty batch")
    if batch > max_batch:
        raise _fail(
            f"input {spec.name!r} has a batch of {batch}; the most one request may send is {max_batch}"
        )
    kind = arr.dtype.kind
    if spec.dtype.kind == "f":
        if kind not in "fiub":
            raise _fail(f"input {spec.name!r} must hold numbers")
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(spec.dtype)
        if not np.all(np.isfinite(out)):
            raise _fail(
                f"input {spec.name!r} contains NaN, infinity or values too large for {spec.dtype.name}"
            )
    elif spec.dtype.kind in "iu":
        if kind not in "iub":
            raise _fail(f"input {spec.name!r} must hold integers ({spec.dtype.name})")
        info = np.iinfo(spec.dtype)
        lo = spec.low if spec.low is not None else info.min
        hi = spec.high - 1 if spec.high is not None else info.max
        if arr.size and (arr.min() < lo or arr.max() > hi):
            raise _fail(f"input {spec.name!r} has values outside [{lo}, {hi}]")
        out = arr.astype(spec.dtype)
    elif spec.dtype.kind == "b":
        if kind not in "bi" or (kind == "i" and arr.size and (arr.min() < 0 or arr.max() > 1)):
            raise _fail(f"input {spec.name!r} must hold booleans")
        out = arr.astype(bool)
    else:
        raise _fail(f"input {spec.name!r} has an unsupported dtype {spec.dtype.name}")
    return np.ascontiguousarray(out)


def _parse_json(body: bytes) -> Any:
    """msgspec when installed (4x faster than json, so a large body holds the GIL a quarter as long).

    What msgspec refuses but json accepts (NaN literals, which the checks below name, and lone
    surrogates) is parsed again by json so that the answer stays the same either way.
    """
    if _msgspec is not None:
        try:
            return _msgspec.json.decode(body)
        except (_msgspec.DecodeError, _msgspec.ValidationError):
            pass
    return json.loads(body)


def decode_json(
    body: bytes, specs: list[InputSpec], max_batch: int, pre: AnyPreprocessor | None = None
) -> list[np.ndarray]:
    """Parse a JSON body into one validated array per input (manifest order).

    With a bundle's preprocessing, ``"raw": {"x": [sample, ...]}`` (or ``"raw": [sample, ...]``) sends
    raw samples of the input it feeds; they go through the recorded steps before the same checks.
    """
    try:
        doc = _parse_json(body)
    except (ValueError, RecursionError) as exc:
        # ValueError covers UnicodeDecodeError and over-long integer literals too.
        raise _fail(f"body is not valid JSON ({_clean(exc)})") from None
    if not isinstance(doc, dict) or ("inputs" not in doc and (pre is None or "raw" not in doc)):
        raise _fail(
            'body must be a JSON object with an "inputs" member' + (' or a "raw" member' if pre else "")
        )
    given: dict[str, np.ndarray] = {}
    if "raw" in doc:
        given = _decode_raw(doc["raw"], specs, max_batch, pre)
    rest = [s for s in specs if s.name not in given]
    raw = doc.get("inputs", {} if given else None)
    if not isinstance(raw, dict):
        if len(rest) != 1:
            raise _fail(f'"inputs" must be an object naming each input: {", ".join(s.name for s in rest)}')
        raw = {rest[0].name: raw}
    missing = [s.name for s in rest if s.name not in raw]
    extra = [k for k in raw if k not in {s.name for s in rest}]
    if missing or extra:
        raise _fail(
            f"inputs must be exactly {', '.join(s.name for s in rest)}"
            + (f" (with {', '.join(given)} sent raw)" if given else "")
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(map(str, extra))[:200]}" if extra else "")
        )
    given.update({s.name: check_array(_to_array(raw[s.name], s, max_batch), s, max_batch) for s in rest})
    arrays = [given[s.name] for s in specs]
    _same_batch(arrays, specs)
    return arrays


def _decode_raw(
    value: Any, specs: list[InputSpec], max_batch: int, pre: AnyPreprocessor | None
) -> dict[str, np.ndarray]:
    """``"raw"`` samples through the bundle's preprocessing: the model input they make, checked like any."""
    if pre is None:
        raise _fail('this bundle records no preprocessing, so it takes no "raw" member; send "inputs"')
    if isinstance(pre, TextPreprocessor):
        return _decode_text(value, specs, max_batch, pre)
    name = pre.input or specs[0].name
    if isinstance(value, dict):
        extra = [k for k in value if k != name]
        if extra or name not in value:
            raise _fail(f'"raw" takes only {name!r} (the input the preprocessing feeds)')
        value = value[name]
    if not isinstance(value, list) or not value:
        raise _fail(f"raw input {name!r} must be a non-empty JSON array of samples")
    if len(value) > max_batch:
        raise _fail(
            f"raw input {name!r} has {len(value)} samples; the most one request may send is {max_batch}"
        )
    samples = []
    for i, item in enumerate(value):
        try:
            arr = np.asarray(item)
        except (ValueError, TypeError, OverflowError, RecursionError):
            raise _fail(f"raw input {name!r} sample {i} must be a rectangular array of numbers") from None
        if arr.dtype.kind not in "fiub":
            raise _fail(f"raw input {name!r} sample {i} must be a rectangular array of numbers")
        samples.append(arr)
    try:
        batch = pre.apply_batch(samples)
    except PreprocessError as exc:
        raise _fail(str(exc)) from None
    spec = next(s for s in specs if s.name == name)
    try:
        return {name: check_array(batch, spec, max_batch)}
    except RequestError as exc:
        raise _fail(f"raw input {name!r} after preprocessing: {exc.reason}") from None


def _decode_text(
    value: Any, specs: list[InputSpec], max_batch: int, pre: TextPreprocessor
) -> dict[str, np.ndarray]:
    """``"raw": {"text": [...]}`` (or one string) through the bundle's tokenizer: the ids (and mask) it makes."""
    if not isinstance(value, dict) or set(value) != {RAW_FIELD}:
        raise _fail(f'"raw" takes only {RAW_FIELD!r} for this bundle (its preprocessing is a tokenizer)')
    texts = value[RAW_FIELD]
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts:
        raise _fail(f"raw input {RAW_FIELD!r} must be a string or a non-empty JSON array of strings")
    if len(texts) > max_batch:
        raise _fail(
            f"raw input {RAW_FIELD!r} has {len(texts)} samples; the most one request may send is {max_batch}"
        )
    try:
        made = pre.apply_batch(texts)
    except PreprocessError as exc:
        raise _fail(str(exc)) from None
    out: dict[str, np.ndarray] = {}
    for name, arr in made.items():
        spec = next(s for s in specs if s.name == name)
        try:
            out[name] = check_array(arr.astype(spec.dtype, copy=False), spec, max_batch)
        except RequestError as exc:
            raise _fail(f"raw input {RAW_FIELD!r} after tokenizing ({name!r}): {exc.reason}") from None
    return out


def _to_array(value: Any, spec: InputSpec, max_batch: int) -> np.ndarray:
    if not isinstance(value, list):
        raise _fail(f"input {spec.name!r} must be a (nested) JSON array")
    # rows and row lengths before np.asarray, which would build whatever it is given (~0.3 s per 10 MB)
    if not value:
        raise _fail(f"input {spec.name!r} has an empty batch")
    if len(value) > max_batch:
        raise _fail(
            f"input {spec.name!r} has a batch of {len(value)}; the most one request may send is {max_batch}"
        )
    depth, first = 0, value
    while isinstance(first, list) and first and depth <= len(spec.shape):
        depth, first = depth + 1, first[0]
    if depth != len(spec.shape) and not isinstance(first, list):
        raise _fail(f"input {spec.name!r} has {depth} dimensions; expected {len(spec.shape)} (batch first)")
    if len(spec.shape) > 1 and spec.shape[1] is not None:
        width = spec.shape[1]
        for row in value:
            if not isinstance(row, list) or len(row) != width:
                got = len(row) if isinstance(row, list) else "a number"
                raise _fail(f"input {spec.name!r} has a row of {got} values in dimension 1; expected {width}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise _fail(f"input {spec.name!r} must be a rectangular array of numbers") from None
    if arr.dtype.kind not in "fiub":
        raise _fail(f"input {spec.name!r} must be a rectangular array of numbers")
    return arr


def decode_npy(body: bytes, specs: list[InputSpec], max_batch: int) -> list[np.ndarray]:
    """Parse a raw ``.npy`` body (single-input models), checking the header before reading data."""
    if len(specs) != 1:
        raise _fail(f"this model has {len(specs)} inputs; send JSON naming each one instead of .npy")
    spec = specs[0]
    fp = io.BytesIO(body)
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fp, max_header_size=4096)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(fp, max_header_size=4096)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as exc:  # numpy raises ValueError/SyntaxError/... for corrupt headers
        raise _fail(f"body is not a valid .npy array ({_clean(exc)})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise _fail("object or structured .npy arrays are not accepted (they would need pickle)")
    if dtype.newbyteorder("=") != spec.dtype.newbyteorder("="):
        # JSON numbers are untyped and get cast; a binary array states its dtype, and a mismatch is a client bug.
        raise _fail(f"the .npy array is {dtype.name}; input {spec.name!r} takes {spec.dtype.name}")
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise _fail(f"the .npy header has an invalid shape {shape!r}")
    if len(shape) != len(spec.shape):
        raise _fail(
            f"input {spec.name!r} has {len(shape)} dimensions; expected {len(spec.shape)} (batch first)"
        )
    for dim, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if (want is not None and got != want) or (dim == 0 and not 1 <= got <= max_batch):
            raise _fail(
                f"input {spec.name!r} has shape {tuple(shape)}; expected {_describe(spec, max_batch)}"
            )
    count = math.prod(shape)
    offset = fp.tell()
    if len(body) - offset != count * dtype.itemsize:
        raise _fail(
            f"the .npy data has {len(body) - offset} bytes; its header promises {count * dtype.itemsize}"
        )
    arr = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(
        shape, order="F" if fortran else "C"
    )
    return [check_array(arr.astype(arr.dtype.newbyteorder("=")), spec, max_batch)]


def _describe(spec: InputSpec, max_batch: int) -> str:
    dims = ", ".join(f"1..{max_batch}" if d is None else str(d) for d in spec.shape)
    return f"({dims})"


def _same_batch(arrays: list[np.ndarray], specs: list[InputSpec]) -> None:
    sizes = {a.shape[0] for a in arrays}
    if len(sizes) > 1:
        raise _fail(f"inputs {', '.join(s.name for s in specs)} have different batch sizes {sorted(sizes)}")


def media_type(content_type: str | None) -> str:
    """The request's media type (parameters like charset dropped), or 415 when it is missing or not accepted.

    Checked from the headers alone, before any body byte is read: a body the server cannot decode is
    not worth receiving.
    """
    media = (content_type or "").split(";")[0].strip().lower()
    if not media:
        raise RequestError(415, "the request has no Content-Type; send application/json or application/x-npy")
    if media not in JSON_TYPES and media not in NPY_TYPES:
        raise RequestError(
            415, f"content type {media[:60]!r} is not accepted; send application/json or application/x-npy"
        )
    return media


def decode(
    body: bytes,
    content_type: str | None,
    specs: list[InputSpec],
    max_batch: int,
    pre: AnyPreprocessor | None = None,
) -> list[np.ndarray]:
    """Dispatch on the content type (media type only; a missing or other type answers 415)."""
    if media_type(content_type) in JSON_TYPES:
        return decode_json(body, specs, max_batch, pre)
    return decode_npy(body, specs, max_batch)


def raw_body_cap(pre: AnyPreprocessor, max_rows: int) -> int | None:
    """The largest body of ``max_rows`` raw samples of a fixed raw size (as :func:`body_cap`); None when resized.
    Texts: their longest accepted length, each character escaped (``\\uXXXX``, 6 bytes)."""
    if isinstance(pre, TextPreprocessor):
        return max_rows * (pre.max_chars * 6 + 4) + BODY_SLACK
    raw = pre.raw
    if raw.size is None:
        return None
    elements = raw.size[0] * raw.size[1] * (raw.channels or 4)
    return max_rows * elements * (_number_text(np.dtype(raw.dtype)) + 2 * 4 + 8) + BODY_SLACK
