"""How pydantic reads the wire types for FastAPI's OpenAPI document (the dataclasses'
`__pydantic_config__`): descriptions from the attributes' docstrings, bytes as base64
strings (schemas only: each type's `to_json` writes the JSON)."""

from __future__ import annotations

from typing import Any

SCHEMA: dict[str, Any] = {"use_attribute_docstrings": True, "ser_json_bytes": "base64"}
