"""JSON Schemas of the JSON documents ddpfix writes, one file per schema id (`ddpfix.report/v1` ->
`ddpfix.report.v1.json` in this directory). They ship in the wheel; tests validate real outputs against them."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def path(schema_id: str) -> Path:
    """The schema file of `schema_id` (e.g. `ddpfix.verify/v1`)."""
    return HERE / (schema_id.replace("/", ".") + ".json")


def load(schema_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path(schema_id).read_text())
    return doc


def ids() -> list[str]:
    """Every schema id that has a file here."""
    return sorted(p.name.removesuffix(".json").rsplit(".", 1)[0] + "/" + p.name.removesuffix(".json").rsplit(".", 1)[1]
                  for p in HERE.glob("*.json"))


def validate(doc: dict[str, Any]) -> None:
    """Validate `doc` against the schema its `schema` key names (raises jsonschema.ValidationError). Needs
    `jsonschema`, a test dependency (`pip install ddpfix[test]`): ddpfix itself never validates at run time."""
    jsonschema = importlib.import_module("jsonschema")  # by name: a test dependency, without type stubs
    validator = jsonschema.Draft202012Validator(load(str(doc["schema"])), format_checker=jsonschema.FormatChecker())
    validator.validate(doc)
