"""``/openapi.json``, built from the route declarations alone.

Each :class:`~qftrio.server.envelope.Route` gives its operation: the body,
query and path models, every status it answers (those the envelope adds
included) and the model of each; pydantic writes the schemas. A request's
or answer's own model is written out in its operation, the models it holds
under ``components``. Every error answer is ``ErrorAnswer``.
"""

from __future__ import annotations

import copy
from typing import Any

import pydantic
from pydantic.json_schema import models_json_schema

from ..models import ErrorAnswer
from .envelope import Route

__all__ = ["document", "STATUS_TEXT"]

STATUS_TEXT = {
    200: "OK", 201: "Created", 204: "No Content", 400: "Malformed JSON", 401: "No credential, or an unknown one",
    403: "A credential of the wrong kind", 404: "Not found", 409: "Conflicts with the job's state",
    413: "Body over the cap", 422: "Breaks the schema (the message names the field)",
    429: "Too many wrong credentials from this address; retry after Retry-After",
    503: "The database cannot be reached; retry",
}  # fmt: skip

_REF = "#/components/schemas/{model}"


def document(routes: list[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of *routes* (those with ``documented``)."""
    routes = [route for route in routes if route.documented]
    models: dict[type[pydantic.BaseModel], None] = {ErrorAnswer: None}
    for route in routes:
        for model in (route.body, route.query, *route.answers.values()):
            if model is not None:
                models[model] = None
    refs, definitions = models_json_schema([(model, "validation") for model in models], ref_template=_REF)
    schemas: dict[str, Any] = definitions.get("$defs", {})

    def own(model: type[pydantic.BaseModel]) -> dict[str, Any]:
        name = refs[(model, "validation")]["$ref"].rpartition("/")[2]
        return copy.deepcopy(schemas[name])

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        path = route.path.replace("<", "{").replace(">", "}")
        paths.setdefault(path, {})[route.method.lower()] = _operation(route, own)
    return {
        "openapi": "3.1.0",
        "info": {"title": "qftrio", "version": "1"},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }


def _operation(route: Route, own: Any) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": f"{route.method.lower()}_{route.name}"}
    summary = (route.handler.__doc__ or "").strip()
    if summary:
        operation["summary"] = summary
    parameters = []
    for name in route.path_names():
        adapter = route.path_params.get(name)
        schema = adapter.json_schema() if adapter is not None else {"type": "string"}
        parameters.append({"in": "path", "name": name, "required": True, "schema": schema})
    if route.query is not None:
        query = own(route.query)
        required = set(query.get("required", ()))
        for name, schema in query.get("properties", {}).items():
            parameter = {"in": "query", "name": name, "schema": schema}
            if name in required:
                parameter["required"] = True
            parameters.append(parameter)
    operation["parameters"] = parameters
    if route.body is not None:
        # An empty body counts as {}: it may be left out when every field may.
        needed = any(field.is_required() for field in route.body.model_fields.values())
        operation["requestBody"] = {"content": {"application/json": {"schema": own(route.body)}}, "required": needed}
    responses: dict[str, Any] = {}
    for status in route.statuses():
        answer: dict[str, Any] = {"description": STATUS_TEXT.get(status, "OK")}
        if status in route.answers:
            model = route.answers[status]
            if route.media is not None:
                answer["content"] = {route.media.split(";")[0]: {"schema": {"type": "string"}}}
            elif model is not None:
                answer["content"] = {"application/json": {"schema": own(model)}}
        else:
            answer["content"] = {"application/json": {"schema": own(ErrorAnswer)}}
        responses[str(status)] = answer
    operation["responses"] = responses
    if route.caller in ("anyone", "metrics"):
        operation["security"] = []
    return operation
