"""OpenAPI pieces for ``/v1/predict`` built from the manifest (the request schema is the contract).

The JSON request schema nests one array level per dimension, with exact item counts for fixed
dims and ``1..max_batch`` for the batch, and float bounds of the input dtype, so a client (or a
property-based fuzzer) can generate valid bodies from the schema alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscalpel.serve.codec import InputSpec

ERROR_SCHEMA = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}


def _leaf(spec: InputSpec) -> dict[str, Any]:
    if spec.dtype.kind == "f":
        bound = float(np.finfo(spec.dtype).max)
        return {"type": "number", "minimum": -bound, "maximum": bound}
    if spec.dtype.kind == "b":
        return {"type": "boolean"}
    info = np.iinfo(spec.dtype)
    lo = spec.low if spec.low is not None else int(info.min)
    hi = spec.high - 1 if spec.high is not None else int(info.max)
    return {"type": "integer", "minimum": lo, "maximum": hi}


def array_schema(spec: InputSpec, max_batch: int) -> dict[str, Any]:
    """Nested-array JSON schema for one input."""
    node = _leaf(spec)
    for d in reversed(range(len(spec.shape))):
        dim = spec.shape[d]
        lo, hi = (1, max_batch if d == 0 else spec.bound(d) or max_batch) if dim is None else (dim, dim)
        node = {"type": "array", "items": node, "minItems": lo, "maxItems": hi}
    return node


def request_schema(specs: list[InputSpec], max_batch: int, raw: bool = False) -> dict[str, Any]:
    """Schema of a JSON predict request (with ``raw``: raw samples for the bundle's preprocessing too)."""
    if raw:
        return {
            "type": "object",
            "minProperties": 1,
            "properties": {
                "inputs": {"type": "object"},
                "raw": {
                    "description": "raw samples, run through the bundle's preprocessing (GET /v1/model)",
                    "type": ["object", "array"],
                },
            },
        }
    return {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": {
                "type": "object",
                "required": [s.name for s in specs],
                "properties": {s.name: array_schema(s, max_batch) for s in specs},
                "additionalProperties": False,
            }
        },
    }


def response_schema(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """Schema of a predict answer."""
    return {
        "type": "object",
        "required": ["outputs", "batch_size"],
        "properties": {
            "outputs": {
                "type": "object",
                "properties": {o["name"]: {"type": "array"} for o in outputs},
                "required": [o["name"] for o in outputs],
            },
            "batch_size": {"type": "integer", "minimum": 1},
        },
    }


def predict_openapi(
    specs: list[InputSpec], outputs: list[dict[str, Any]], max_batch: int, *, raw: bool = False
) -> dict[str, Any]:
    """``openapi_extra`` for the predict route: request body and every status it can answer."""
    err = {"application/json": {"schema": ERROR_SCHEMA}}
    content: dict[str, Any] = {"application/json": {"schema": request_schema(specs, max_batch, raw)}}
    if len(specs) == 1:
        content["application/x-npy"] = {"schema": {"type": "string", "format": "binary"}}
    return {
        "requestBody": {"required": True, "content": content},
        "responses": {
            "200": {
                "description": "model outputs",
                "content": {"application/json": {"schema": response_schema(outputs)}},
            },
            "400": {"description": "malformed HTTP request", "content": err},
            "401": {"description": "missing or wrong bearer token", "content": err},
            "408": {"description": "body not received in time", "content": err},
            "413": {"description": "body over the size limit", "content": err},
            "415": {"description": "unsupported content type", "content": err},
            "422": {"description": "input does not match the model (shape, dtype, values)", "content": err},
            "500": {"description": "the model failed on a valid input", "content": err},
            "503": {"description": "queue full; retry after Retry-After seconds", "content": err},
            "504": {"description": "no answer within the request timeout", "content": err},
        },
    }
