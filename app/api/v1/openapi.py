"""The OpenAPI document as a client generator or a reader of /api/v1/docs wants it.

Every route sits on the one `api` blueprint, so APIFlask put all of them under one tag, "Api";
here each operation is tagged by the resource module that defines it (Attempts, Studies, ...),
the tag described by the module's first docstring sentence. And a schema class that a list's
items use before an endpoint returns it alone is registered twice by APIFlask (`StudyOut` and an
identical `StudyOut1`); the copies are folded into the first name.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from apiflask import APIFlask

API_MODULES = "app.api.v1."
_RULE_ARGUMENT = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_NUMBERED = re.compile(r"^(?P<base>.*\D)\d+$")


def install(app: APIFlask) -> None:
    """Tidy the app's OpenAPI document each time it is generated."""

    @app.spec_processor
    def tidy(spec: dict[Any, Any] | str) -> dict[Any, Any] | str:
        if isinstance(spec, str):  # SPEC_FORMAT yaml: not this portal's
            return spec
        return fold_duplicate_schemas(tag_by_resource(app, spec))


def tag_by_resource(app: APIFlask, spec: dict[str, Any]) -> dict[str, Any]:
    """Tag each operation with its resource module's name; list the tags, described."""
    paths: dict[str, dict[str, Any]] = spec.get("paths", {})
    used: dict[str, str] = {}
    for rule in app.url_map.iter_rules():
        module = app.view_functions[rule.endpoint].__module__
        if not module.startswith(API_MODULES):
            continue
        operations = paths.get(_RULE_ARGUMENT.sub(r"{\1}", rule.rule), {})
        tag = module.removeprefix(API_MODULES).replace("_", " ").capitalize()
        for method in rule.methods or ():
            operation = operations.get(method.lower())
            if isinstance(operation, dict):
                operation["tags"] = [tag]
                used[tag] = module
    spec["tags"] = [
        {"name": tag, "description": _first_sentence(sys.modules[module].__doc__ or "")}
        for tag, module in sorted(used.items())
    ]
    return spec


def _first_sentence(docstring: str) -> str:
    paragraph = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    return re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0].rstrip(".")


def fold_duplicate_schemas(spec: dict[str, Any]) -> dict[str, Any]:
    """Replace every `X<digits>` component identical to a component `X` by a reference to `X`."""
    schemas: dict[str, Any] = spec.get("components", {}).get("schemas", {})
    folded = {
        name: match["base"]
        for name in list(schemas)
        if (match := _NUMBERED.match(name)) and schemas.get(match["base"]) == schemas[name]
    }
    if not folded:
        return spec
    for name in folded:
        del schemas[name]
    text = json.dumps(spec)
    for name, base in folded.items():
        text = text.replace(f'"#/components/schemas/{name}"', f'"#/components/schemas/{base}"')
    folded_spec: dict[str, Any] = json.loads(text)
    return folded_spec
