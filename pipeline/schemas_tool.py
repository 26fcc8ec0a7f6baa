"""Write schemas/<name>.v<version>.json from pipeline/model.py.

The model is the single source of the contracts; this tool renders it as JSON Schema 2020-12
for consumers in other languages. A test fails when the committed files and the model differ,
so a field change cannot slip through without a new schema version.

    python -m pipeline.schemas_tool          # rewrite the files
    python -m pipeline.schemas_tool --check  # exit 1 if they are stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from pipeline.model import TOPIC_VALUES, Event

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# `$id`s are absolute URIs (JSON Schema wants them so); CloudEvents' `dataschema` names them.
ID_BASE = "https://fleetpulse.io/schemas"


def schema_tag(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str), f"{cls.__name__} has no schema tag"
    return tag


def file_name(cls: type[Event]) -> str:
    name, version = schema_tag(cls).split("/")
    return f"{name}.v{version}.json"


def schema_id(cls: type[Event]) -> str:
    """The schema's `$id`: https://fleetpulse.io/schemas/<name>/v<version>.json."""
    name, version = schema_tag(cls).split("/")
    return f"{ID_BASE}/{name}/v{version}.json"


def render(cls: type[Event]) -> dict[str, Any]:
    body = msgspec.json.schema(cls)
    root = body["$defs"][cls.__name__]
    # the tag field is msgspec's, not a declared field: describe it here
    root["properties"]["schema"]["description"] = (
        "Schema name and version of this value; a consumer reads only versions it knows."
    )
    return {
        "$schema": DIALECT,
        "$id": schema_id(cls),
        **root,
        "$defs": {k: v for k, v in body["$defs"].items() if k != cls.__name__},
    }


def rendered_files() -> dict[str, str]:
    return {
        file_name(cls): json.dumps(render(cls), indent=2, sort_keys=True) + "\n"
        for cls in TOPIC_VALUES.values()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if files are stale")
    args = parser.parse_args()
    stale = []
    for name, text in rendered_files().items():
        path = SCHEMA_DIR / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    print(("stale: " if args.check else "written: ") + (", ".join(stale) or "none"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
