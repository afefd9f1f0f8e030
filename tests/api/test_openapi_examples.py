"""Every request body of the REST API has an example in /openapi.json (what Swagger UI's
"Try it out" starts from), and each one, executed against a real server, succeeds.

A path's {session_id} is a session made from POST /v1/sessions's own example; the batch
examples name a session by an id of the right shape (models.EXAMPLE_SESSION_ID): as
they stand they are answered per item (NOT_FOUND, never a refused request), and with a
real session's id pasted in, every item succeeds.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from env_server.service.models import EXAMPLE_SESSION_ID


def body_example(spec: dict[str, Any], operation: dict[str, Any]) -> Any:
    """The example Swagger UI fills in: the request schema's first example."""
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    schema = next((s for s in schema.get("anyOf", [schema]) if "$ref" in s), schema)
    name = schema["$ref"].rsplit("/", 1)[1]
    examples = spec["components"]["schemas"][name].get("examples")
    assert examples, f"{name} has no example: Swagger UI would make one up"
    return examples[0]


@pytest.fixture(scope="module")
def operations(visenv_server) -> list[tuple[str, str, Any]]:
    spec = httpx.get(f"{visenv_server.url}/openapi.json").json()
    found = [
        (method.upper(), path, body_example(spec, op))
        for path, ops in spec["paths"].items()
        if path.startswith("/v1/")
        for method, op in ops.items()
        if "requestBody" in op
    ]
    assert len(found) >= 9, found  # create, reset, step, fork and the five batch calls
    return found


def new_session(server) -> str:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    example = body_example(spec, spec["paths"]["/v1/sessions"]["post"])
    reply = httpx.post(f"{server.url}/v1/sessions", json=example, headers=server.headers)
    assert reply.status_code == 200, reply.text
    return reply.json()["session_id"]


def test_every_example_succeeds_as_it_stands(visenv_server, operations) -> None:
    for method, path, example in operations:
        url = visenv_server.url + path.replace("{session_id}", new_session(visenv_server))
        reply = httpx.request(method, url, json=example, headers=visenv_server.headers)
        assert reply.status_code == 200, f"{method} {path} with {example}: {reply.text}"
        for item in reply.json().get("results", []):  # a batch: answered per item
            error = item.get("error")
            assert error is None or error["code"] == "NOT_FOUND", f"{path}: {item}"


def test_every_batch_example_succeeds_for_a_real_session(visenv_server, operations) -> None:
    for method, path, example in operations:
        if EXAMPLE_SESSION_ID not in json.dumps(example):
            continue
        filled = json.loads(
            json.dumps(example).replace(EXAMPLE_SESSION_ID, new_session(visenv_server))
        )
        reply = httpx.request(
            method, visenv_server.url + path, json=filled, headers=visenv_server.headers
        )
        assert reply.status_code == 200, reply.text
        results = reply.json()["results"]
        assert results and all(r.get("error") is None for r in results), f"{path}: {results}"


def test_the_create_example_is_not_swaggers_made_up_one(operations) -> None:
    create = next(e for m, p, e in operations if p == "/v1/sessions")
    assert "additionalProp1" not in json.dumps([e for _, _, e in operations])
    assert create["env"] == "sokoban"
