"""Property-based fuzzing of the live server from its own OpenAPI schema (schemathesis), bounded in time.

Checks: no 5xx for any generated request, every status is documented, responses match their
schemas, schema-valid bodies are accepted and invalid ones rejected. Loopback only.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from fixtures.live_server import live_server
from fixtures.serve_bundles import LinearRunner, linear_bundle
from torchscalpel.serve.app import ServeConfig, create_app


def test_openapi_fuzz_finds_no_server_errors(tmp_path):
    app = create_app(
        linear_bundle(tmp_path, max_batch=4), LinearRunner(), ServeConfig(max_wait_ms=0, max_body=256 << 10)
    )
    with live_server(app) as (host, port):
        base = f"http://{host}:{port}"
        schema = schemathesis.openapi.from_dict(app.openapi())
        seen: dict[str, list[int]] = {}
        failures: list[str] = []
        for operation in schema.get_all_operations():
            op = operation.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and op.method.upper() != "POST":
                    continue  # GETs take no input: nothing to make invalid
                _fuzz(op.as_strategy(mode), base, f"{op.label} [{mode.value}]", seen, failures)
        assert not failures, "\n".join(failures[:5])
        assert any(code == 200 for code in seen["POST /v1/predict [positive]"]), seen[
            "POST /v1/predict [positive]"
        ]
        assert all(code < 500 for codes in seen.values() for code in codes)


def _fuzz(strategy, base: str, label: str, seen: dict[str, list[int]], failures: list[str]) -> None:
    # Bounded: 40 examples per operation and mode keeps the whole test under a minute on 2 cores.
    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def check(case):
        try:
            response = case.call_and_validate(base_url=base)
            seen.setdefault(label, []).append(response.status_code)
        except Exception as exc:  # collect, so one report shows every distinct failure
            failures.append(f"{label}: {str(exc)[:600]}")

    check()
