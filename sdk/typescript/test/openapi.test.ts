// The SDK's routes and wire types against the server's own /openapi.json:
// they fail here as soon as they drift from what the server serves.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { ROUTES } from "qftrio";
import { testServer } from "./server.js";

type Schema = {
  $ref?: string;
  title?: string;
  type?: string;
  enum?: unknown[];
  anyOf?: Schema[];
  properties?: Record<string, Schema>;
  required?: string[];
  [key: string]: unknown;
};
type Operation = {
  parameters?: { in: string; name: string }[];
  requestBody?: { content: { "application/json": { schema: Schema } } };
  responses: Record<string, { content?: { "application/json"?: { schema: Schema }; "text/event-stream"?: { schema: Schema } } }>;
};
type Document = { paths: Record<string, Record<string, Operation>>; components: { schemas: Record<string, Schema> } };

interface WireProperty {
  optional: boolean;
  nullable: boolean;
}
interface WireType {
  name: string;
  properties?: Map<string, WireProperty>;
  values?: string[];
}

/** The `@wire`-tagged types of src/types.ts, by the schema title they name. */
function wireTypes(): Map<string, WireType> {
  const path = fileURLToPath(new URL("../../src/types.ts", import.meta.url));
  const source = ts.createSourceFile(path, readFileSync(path, "utf8"), ts.ScriptTarget.Latest, true);
  const hasNull = (node: ts.TypeNode): boolean =>
    ts.isUnionTypeNode(node)
      ? node.types.some(hasNull)
      : ts.isLiteralTypeNode(node) && node.literal.kind === ts.SyntaxKind.NullKeyword;
  const found = new Map<string, WireType>();
  for (const statement of source.statements) {
    const tag = ts.getJSDocTags(statement).find((t) => t.tagName.text === "wire");
    if (!tag) continue;
    const title = (ts.getTextOfJSDocComment(tag.comment) ?? "").trim();
    if (ts.isInterfaceDeclaration(statement)) {
      const properties = new Map<string, WireProperty>();
      for (const member of statement.members) {
        if (!ts.isPropertySignature(member) || !member.type) continue;
        properties.set(member.name.getText(source), { optional: !!member.questionToken, nullable: hasNull(member.type) });
      }
      found.set(title, { name: statement.name.text, properties });
    } else if (ts.isTypeAliasDeclaration(statement) && ts.isUnionTypeNode(statement.type)) {
      const values = statement.type.types.map((t) =>
        ts.isLiteralTypeNode(t) && ts.isStringLiteral(t.literal) ? t.literal.text : t.getText(source),
      );
      found.set(title, { name: statement.name.text, values });
    }
  }
  return found;
}

const types = wireTypes();
const server = await testServer();
after(() => server.stop());
const doc = (await (await fetch(`${server.url}/openapi.json`)).json()) as Document;

function deref(schema: Schema): Schema {
  if (!schema.$ref) return schema;
  const name = schema.$ref.replace("#/components/schemas/", "");
  const target = doc.components.schemas[name];
  assert.ok(target, `the document's ${schema.$ref} resolves`);
  return target;
}

function allowsNull(schema: Schema): boolean {
  const s = deref(schema);
  return s.type === "null" || (s.anyOf ?? []).some(allowsNull);
}

/** Every schema of the document that has a title, by title. */
function titled(): Map<string, Schema> {
  const found = new Map<string, Schema>();
  const walk = (value: unknown): void => {
    if (Array.isArray(value)) return value.forEach(walk);
    if (typeof value !== "object" || value === null) return;
    const schema = value as Schema;
    if (typeof schema.title === "string" && (schema.properties || schema.enum) && !found.has(schema.title)) {
      found.set(schema.title, schema);
    }
    Object.values(value).forEach(walk);
  };
  walk(doc);
  return found;
}

/** *type* against *schema*. An answer's type declares exactly the schema's
 * fields; a request's type sends no field the server refuses and every one
 * it requires. */
function check(title: string, schema: Schema, problems: string[]): void {
  const type = types.get(title);
  if (!type) return void problems.push(`${title}: no type of the SDK is tagged @wire ${title}`);
  const where = `${type.name} (@wire ${title})`;
  schema = deref(schema);
  if (type.values) {
    const server = (schema.enum ?? []).map(String).sort();
    if (JSON.stringify(server) !== JSON.stringify([...type.values].sort())) {
      problems.push(`${where}: the SDK has ${type.values.join(" | ")}, the server ${server.join(" | ")}`);
    }
    return;
  }
  const answer = title.endsWith("Answer");
  const fields = schema.properties ?? {};
  const required = new Set(schema.required ?? []);
  for (const [name, prop] of type.properties!) {
    const field = fields[name];
    if (!field) {
      problems.push(`${where}.${name}: the server has no such field`);
      continue;
    }
    if (answer && !prop.optional !== required.has(name)) {
      problems.push(`${where}.${name}: the SDK says ${prop.optional ? "optional" : "always sent"}, the server ${required.has(name) ? "always sends it" : "may leave it out"}`);
    }
    if (answer ? prop.nullable !== allowsNull(field) : prop.nullable && !allowsNull(field)) {
      problems.push(`${where}.${name}: the SDK says ${prop.nullable ? "" : "never "}null, the server ${allowsNull(field) ? "allows" : "refuses"} null`);
    }
  }
  for (const name of Object.keys(fields)) {
    if (!type.properties!.has(name) && (answer || required.has(name))) {
      problems.push(`${where}.${name}: the server ${answer ? "answers" : "requires"} this field; the SDK lacks it`);
    }
    if (!answer && required.has(name) && type.properties!.get(name)?.optional) {
      problems.push(`${where}.${name}: the server requires this field; the SDK makes it optional`);
    }
  }
}

test("every route of the SDK is the server's, with its query, body and answer", () => {
  const problems: string[] = [];
  for (const [name, route] of Object.entries(ROUTES)) {
    const operation = doc.paths[route.path]?.[route.method.toLowerCase()];
    if (!operation) {
      problems.push(`${name}: the server has no ${route.method} ${route.path}`);
      continue;
    }
    const query = (operation.parameters ?? []).filter((p) => p.in === "query").map((p) => p.name).sort();
    const declared = "query" in route ? [...route.query].sort() : [];
    if (JSON.stringify(query) !== JSON.stringify(declared)) {
      problems.push(`${name}: the server takes the query ${query.join(", ") || "(none)"}, the SDK ${declared.join(", ") || "(none)"}`);
    }
    const body = operation.requestBody?.content["application/json"].schema;
    if (route.request) {
      if (body) check(route.request, body, problems);
      else problems.push(`${name}: the server takes no body`);
    } else if (body && deref(body).required?.length) {
      problems.push(`${name}: the server requires a body, the SDK sends none`);
    }
    const success = Object.entries(operation.responses).filter(([code]) => code.startsWith("2"));
    for (const [code, response] of success) {
      const schema = response.content?.["application/json"]?.schema;
      if ("stream" in route) {
        if (!response.content?.["text/event-stream"]) problems.push(`${name}: the server answers ${code} with no event stream`);
      } else if (route.answer === null) {
        if (code !== "204") problems.push(`${name}: the server answers ${code}, the SDK expects 204`);
      } else if (!schema) {
        problems.push(`${name}: the server answers ${code} with no JSON`);
      } else {
        check(route.answer, schema, problems);
      }
    }
  }
  assert.deepEqual([...new Set(problems)], []);
});

test("every route of the server has a method in the SDK", () => {
  const declared = new Set(Object.values(ROUTES).map((r) => `${r.method} ${r.path}`));
  const missing: string[] = [];
  for (const [path, operations] of Object.entries(doc.paths)) {
    for (const method of Object.keys(operations)) {
      const route = `${method.toUpperCase()} ${path}`;
      // Prometheus text is for scrapers, not for a client.
      if (route !== "GET /metrics" && !declared.has(route)) missing.push(route);
    }
  }
  assert.deepEqual(missing, []);
});

test("every type tagged @wire matches the server's schema of that name", () => {
  const schemas = titled();
  const problems: string[] = [];
  // A route's own body and answer are checked with the route, whatever the
  // server's schema is called.
  const routes = new Set<string | null>(Object.values(ROUTES).flatMap((r) => [r.request, r.answer]));
  for (const title of types.keys()) {
    const schema = schemas.get(title);
    if (schema) check(title, schema, problems);
    else if (!routes.has(title)) problems.push(`@wire ${title}: the server's document has no schema of that title`);
  }
  assert.deepEqual([...new Set(problems)], []);
});
