"""The OpenAPI document of a real `visenv serve` (with every adapter's routes) describes
every operation, parameter and schema field, and documents no error shape it never sends."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from env_server.testing.launcher import VisenvServer, launch_server


@pytest.fixture(scope="module")
def server() -> Iterator[VisenvServer]:
    server = launch_server(workers=1, envs="sokoban", extra_env={"VISENV_VAGEN_LEGACY": "true"})
    yield server
    server.stop()


def undescribed(schema: dict) -> list[str]:
    missing = []
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            if not op.get("description"):
                missing.append(f"operation {method.upper()} {path}")
            for p in op.get("parameters", []):
                if not p.get("description"):
                    missing.append(f"parameter {p['name']} of {method.upper()} {path}")
    for name, component in schema["components"]["schemas"].items():
        if not component.get("description"):
            missing.append(f"schema {name}")
        for field, prop in (component.get("properties") or {}).items():
            if not prop.get("description"):
                missing.append(f"field {name}.{field}")
    return missing


def test_every_operation_parameter_and_field_has_a_description(server) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert "/compat/vagen-legacy/batch/step" in schema["paths"]  # the adapters are in it
    assert len(schema["paths"]) > 25
    assert undescribed(schema) == []
    step = schema["paths"]["/v1/sessions/{session_id}/step"]["post"]
    [session_id] = step["parameters"]
    assert "create reply" in session_id["description"]
    # a malformed request is answered as an ErrorReply (422), which is what is documented
    assert step["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorReply"
    }
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    bad = httpx.post(f"{server.url}/v1/sessions/x/step", json={"step_index": -1})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_ARGUMENT"


def test_the_check_finds_a_missing_description() -> None:
    schema = {
        "paths": {"/x/{id}": {"get": {"description": "d", "parameters": [{"name": "id"}]}}},
        "components": {"schemas": {"S": {"description": "s", "properties": {"f": {}}}}},
    }
    assert undescribed(schema) == ["parameter id of GET /x/{id}", "field S.f"]
