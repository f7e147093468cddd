"""The client is checked against the committed OpenAPI document: every
operation is covered by a row of ``OPERATIONS`` and a method of the same name,
and every typed body has exactly the schema's fields.

To cover a new endpoint: add its dataclasses to ``dpledger/types.py`` (with
``__schema__``), a row to ``dpledger.client.OPERATIONS`` and a ``Client`` method
named after the operationId."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from dpledger import OPERATIONS, Client
from dpledger.types import SCHEMA_TYPES, DatasetConfig, PoissonSampling, ShuffleSampling

from conftest import OPENAPI

METHODS = ("get", "post", "put", "patch", "delete")


def _document():
    return json.loads(OPENAPI.read_text())


def _operations():
    doc = _document()
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method.upper(), item[method]


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def test_every_openapi_operation_is_covered():
    missing, wrong = [], []
    seen = set()
    for path, method, op in _operations():
        op_id = op["operationId"]
        seen.add(op_id)
        row = OPERATIONS.get(op_id)
        if row is None or not callable(getattr(Client, op_id, None)):
            missing.append(f"{method} {path} ({op_id})")
            continue
        if (row.method, row.path) != (method, path):
            wrong.append(f"{op_id}: document {method} {path}, client {row.method} {row.path}")
    assert not missing, "operations the Python client does not cover: " + ", ".join(missing)
    assert not wrong, "; ".join(wrong)
    stale = sorted(set(OPERATIONS) - seen)
    assert not stale, f"client operations that the document does not have: {stale}"


def test_every_client_method_uses_its_table_row():
    """Each public method is an operation (no stray endpoints), and its source
    names its own operationId when calling the server."""
    public = {
        name
        for name, member in inspect.getmembers(Client, inspect.isfunction)
        if not name.startswith("_") and name not in ("close", "with_token")
    }
    assert public == set(OPERATIONS), public ^ set(OPERATIONS)
    for name in public:
        source = inspect.getsource(getattr(Client, name))
        assert f'"{name}"' in source, f"Client.{name} does not send operation {name!r}"


def test_success_bodies_match_the_documented_schemas():
    for path, method, op in _operations():
        row = OPERATIONS.get(op["operationId"])
        if row is None:
            continue  # reported by test_every_openapi_operation_is_covered
        ok = [code for code in op["responses"] if code.startswith("2")]
        assert len(ok) == 1, (path, ok)
        content = op["responses"][ok[0]].get("content", {})
        schema = content.get("application/json", {}).get("schema", {})
        if "$ref" in schema:
            assert row.response is not None, op["operationId"]
            assert row.response.__schema__ == _ref_name(schema["$ref"]), op["operationId"]
        else:
            # Plain text (metrics) or a free document (openapi.json): raw response.
            assert row.response is None, op["operationId"]


def test_request_bodies_are_typed():
    """Every JSON request body's schema has a dataclass (the client builds the
    body from it, so its fields are checked below)."""
    for path, method, op in _operations():
        body = op.get("requestBody")
        if not body or op["operationId"] not in OPERATIONS:
            continue
        schema = body["content"]["application/json"]["schema"]
        assert "$ref" in schema, path
        assert _ref_name(schema["$ref"]) in SCHEMA_TYPES, f"no dataclass for {schema['$ref']}"


def _nullable(prop: dict) -> bool:
    t = prop.get("type")
    if isinstance(t, list) and "null" in t:
        return True
    return any(alt.get("type") == "null" for alt in prop.get("oneOf", []))


def _flatten(schema: dict, schemas: dict) -> "tuple[dict, set]":
    """An object schema's properties and required names, with ``allOf`` members
    (inline or ``$ref``, as serde's ``flatten`` produces) merged in."""
    if "$ref" in schema:
        schema = schemas[_ref_name(schema["$ref"])]
    props = dict(schema.get("properties", {}))
    required = set(schema.get("required", []))
    for member in schema.get("allOf", []):
        p, r = _flatten(member, schemas)
        props.update(p)
        required |= r
    return props, required


@pytest.mark.parametrize("schema_name", sorted(SCHEMA_TYPES))
def test_dataclass_fields_equal_schema_properties(schema_name):
    schemas = _document()["components"]["schemas"]
    assert schema_name in schemas, f"{schema_name} is not in the OpenAPI document"
    schema = schemas[schema_name]
    cls = SCHEMA_TYPES[schema_name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    props, required = _flatten(schema, schemas)
    assert set(fields) == set(props), f"{schema_name}: fields {sorted(fields)} vs schema {sorted(props)}"
    for name, f in fields.items():
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
        assert has_default == (name not in required), f"{schema_name}.{name}: required={name in required}"
        if f.default is None:
            assert _nullable(props[name]), f"{schema_name}.{name} defaults to None but is not nullable"


def test_every_component_schema_has_a_type():
    """Objects are dataclasses; enums and the tagged Sampling union are typed
    as Literals / variants (checked against the document here)."""
    schemas = _document()["components"]["schemas"]
    for name, schema in schemas.items():
        if "enum" in schema:
            continue
        if name == "Sampling":
            kinds = {alt["properties"]["kind"]["enum"][0]: set(alt["properties"]) for alt in schema["oneOf"]}
            assert kinds == {
                "poisson": {f.name for f in dataclasses.fields(PoissonSampling)},
                "shuffle": {f.name for f in dataclasses.fields(ShuffleSampling)},
            }
            continue
        assert name in SCHEMA_TYPES, f"schema {name} has no dataclass in dpledger.types"
    assert DatasetConfig.__schema__ == "DatasetConfig"
