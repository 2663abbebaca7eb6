"""``/docs``: a page that renders ``/openapi.json`` readably, with nothing
loaded from elsewhere (it works offline and behind any firewall).

The Swagger UI shipped on PyPI (py-swagger-ui) is a 4.x release, which does
not render OpenAPI 3.1, the version the document is in; this page is small
and enough to read the document: every route, who may call it, its
parameters, body and answers, with their schemas.
"""

from __future__ import annotations

__all__ = ["DOCS_PAGE"]

DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>qftrio API</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222; }
h2 { font-size: 1.05em; margin: 1.6em 0 .3em; font-family: ui-monospace, monospace; }
.method { display: inline-block; min-width: 4em; color: #fff; background: #557; padding: 0 .4em; border-radius: 3px; }
.POST { background: #286; } .GET { background: #269; }
table { border-collapse: collapse; margin: .3em 0; }
td, th { border: 1px solid #ccc; padding: .15em .5em; text-align: left; vertical-align: top; }
pre { background: #f4f4f4; padding: .5em; overflow-x: auto; font-size: 13px; margin: .2em 0; }
details { margin: .2em 0; } .muted { color: #666; }
</style>
</head>
<body>
<h1>qftrio API</h1>
<p class="muted">Rendered from <a href="/openapi.json">/openapi.json</a>.</p>
<div id="routes">Loading&hellip;</div>
<script>
"use strict";
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, attrs || {});
  for (const child of children) node.append(child);
  return node;
}
function schemaBlock(schema) {
  return el("pre", {}, JSON.stringify(schema, null, 2));
}
function render(doc) {
  const root = document.getElementById("routes");
  root.replaceChildren();
  const schemas = (doc.components || {}).schemas || {};
  root.append(el("details", {}, el("summary", {}, "Schemas"),
    ...Object.entries(schemas).map(([name, s]) => el("div", {}, el("b", {}, name), schemaBlock(s)))));
  for (const [path, operations] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(operations)) {
      const m = method.toUpperCase();
      const secured = (op.security || doc.security || []).length > 0;
      const section = el("section", {},
        el("h2", {}, el("span", {className: "method " + m}, m), " ", path),
        el("div", {}, op.summary || "", " ", el("span", {className: "muted"}, secured ? "(bearer token)" : "(no credential)")));
      const params = op.parameters || [];
      if (params.length) {
        section.append(el("table", {}, el("tr", {}, el("th", {}, "parameter"), el("th", {}, "in"), el("th", {}, "schema")),
          ...params.map(p => el("tr", {}, el("td", {}, p.name + (p.required ? " *" : "")), el("td", {}, p.in),
            el("td", {}, JSON.stringify(p.schema))))));
      }
      if (op.requestBody) {
        for (const [type, media] of Object.entries(op.requestBody.content || {})) {
          section.append(el("details", {}, el("summary", {}, "body (" + type + ")"), schemaBlock(media.schema)));
        }
      }
      for (const [status, response] of Object.entries(op.responses || {})) {
        const content = Object.entries(response.content || {});
        const line = status + " " + (response.description || "");
        section.append(content.length
          ? el("details", {}, el("summary", {}, line), ...content.map(([t, media]) => schemaBlock(media.schema)))
          : el("div", {}, line));
      }
      root.append(section);
    }
  }
}
fetch("/openapi.json").then(r => r.json()).then(render).catch(err => {
  document.getElementById("routes").textContent = "Could not load /openapi.json: " + err;
});
</script>
</body>
</html>
"""
