#!/usr/bin/env python3
"""Avro the way the Python Confluent client writes and reads it, for the cross-implementation
tests (tests/avro_interop.rs): the real `confluent_kafka.schema_registry` client and its
AvroSerializer / AvroDeserializer against a schema registry at --registry (in the tests,
src/avro/registry_server.rs on loopback), and fastavro's bare datums. Run it with the venv of
tests/python/requirements.txt (`scripts/python-venv.sh tests/python/requirements.txt` prints
its python). It talks to nothing but the registry URL it is given.

  serialize --registry URL --topic T --schema FILE [--subject-strategy topic|record|topic_record]
      stdin: one JSON record per line; stdout: one hex line per record, the record value as
      AvroSerializer frames it for topic T (magic byte 0, 4-byte big-endian schema id, the
      datum), registering the schema (auto.register.schemas) under the strategy's subject:
      T-value (topic, the default), the record's full name (record), or T-<full name>
      (topic_record).
  schemaless --schema FILE
      the same input; stdout: hex of each bare datum (fastavro.schemaless_writer, no framing).
  deserialize --registry URL --topic T
      stdin: hex lines as serialize writes them; stdout: one JSON line per record, decoded by
      AvroDeserializer with the writer's schema fetched from the registry by id, keys sorted.

Input JSON, as Avro's types expect it, with these conversions (nothing else is converted):
  - bytes and fixed: a base64 string (standard alphabet, padded); decimal (bytes or fixed
    with logicalType decimal): a string such as "12.34";
  - timestamp-millis/-micros, date, time-*: the number (epoch millis etc.), kept as is;
  - uuid: a string; enums: the symbol; maps: a JSON object; unions: the bare value (null for
    null, not Avro's JSON-encoding wrapper {"type": value}); a string goes to a bytes or
    fixed branch only when the union has no string branch.
Output JSON: bytes as base64, datetime/date/time as ISO 8601, Decimal and UUID as strings.

--retries N sets the registry client's `max.retries` (its default: 3, with backoff; 503 and
other 5xx answers are retried). Failures end the tool with status 1 and the error, with its
traceback, on stderr.
"""

import argparse
import base64
import datetime
import decimal
import io
import json
import sys
import traceback
import uuid

import fastavro
from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

STRATEGIES = {
    "topic": topic_subject_name_strategy,
    "record": record_subject_name_strategy,
    "topic_record": topic_record_subject_name_strategy,
}

PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
COMPLEX = {"record", "error", "enum", "fixed", "array", "map"}


class Converter:
    """Turns a JSON value into what fastavro writes for a schema (see the module doc)."""

    def __init__(self, schema):
        self.named = {}
        self._collect(schema, None)
        self.schema = schema

    def _fullname(self, node, namespace):
        name = node["name"]
        if "." in name:
            return name, name.rsplit(".", 1)[0]
        namespace = node.get("namespace", namespace)
        return (f"{namespace}.{name}" if namespace else name), namespace

    def _collect(self, node, namespace):
        """Every named type, by full name and by short name, so references resolve."""
        if isinstance(node, list):
            for branch in node:
                self._collect(branch, namespace)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error", "enum", "fixed"):
                fullname, namespace = self._fullname(node, namespace)
                self.named[fullname] = node
                self.named.setdefault(node["name"].rsplit(".", 1)[-1], node)
                for field in node.get("fields", []):
                    self._collect(field["type"], namespace)
            elif kind == "array":
                self._collect(node["items"], namespace)
            elif kind == "map":
                self._collect(node["values"], namespace)
            elif isinstance(kind, (dict, list)):
                self._collect(kind, namespace)

    def resolve(self, node):
        """The type a node stands for: a named type's definition for its name, the inner
        type of a {"type": {...}} or {"type": "Name"} wrapper."""
        while True:
            if isinstance(node, str):
                return node if node in PRIMITIVES else self.named.get(node, node)
            inner = node.get("type") if isinstance(node, dict) else None
            if isinstance(inner, (dict, list)) or (
                isinstance(inner, str) and inner not in PRIMITIVES and inner not in COMPLEX
            ):
                node = inner
                continue
            return node

    @staticmethod
    def _kind(node):
        return node if isinstance(node, str) else node.get("type")

    def convert(self, node, value):
        node = self.resolve(node)
        if isinstance(node, list):
            return self._union(node, value)
        kind = self._kind(node)
        logical = node.get("logicalType") if isinstance(node, dict) else None
        if kind in ("bytes", "fixed") and isinstance(value, str):
            if logical == "decimal":
                return decimal.Decimal(value)
            return base64.b64decode(value, validate=True)
        if kind in ("record", "error") and isinstance(value, dict):
            return {
                field["name"]: self.convert(field["type"], value[field["name"]])
                for field in node["fields"]
                if field["name"] in value
            }
        if kind == "array" and isinstance(value, list):
            return [self.convert(node["items"], item) for item in value]
        if kind == "map" and isinstance(value, dict):
            return {k: self.convert(node["values"], v) for k, v in value.items()}
        return value

    def _union(self, branches, value):
        if value is None:
            return None
        kinds = [self._kind(self.resolve(b)) for b in branches]
        if isinstance(value, str):
            if "string" in kinds or "enum" in kinds:
                return value
            for branch, kind in zip(branches, kinds):
                if kind in ("bytes", "fixed"):
                    return self.convert(branch, value)
        for branch, kind in zip(branches, kinds):
            if kind in ("record", "error", "map") and isinstance(value, dict):
                return self.convert(branch, value)
            if kind == "array" and isinstance(value, list):
                return self.convert(branch, value)
        return value


def to_json(value):
    """`default` for json.dumps: the types fastavro decodes to that JSON has not."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def records():
    for number, line in enumerate(sys.stdin, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"avro_tool: input line {number} is not JSON: {e}")


def client(args):
    conf = {"url": args.registry}
    if args.retries is not None:
        conf["max.retries"] = args.retries
    return SchemaRegistryClient(conf)


def serialize(args):
    with open(args.schema) as f:
        schema_text = f.read()
    converter = Converter(json.loads(schema_text))
    serializer = AvroSerializer(
        client(args),
        schema_text,
        to_dict=lambda obj, ctx: converter.convert(converter.schema, obj),
        conf={
            "auto.register.schemas": True,
            "subject.name.strategy": STRATEGIES[args.subject_strategy],
        },
    )
    context = SerializationContext(args.topic, MessageField.VALUE)
    for record in records():
        print(serializer(record, context).hex(), flush=True)


def schemaless(args):
    with open(args.schema) as f:
        schema = json.load(f)
    converter = Converter(schema)
    parsed = fastavro.parse_schema(schema)
    for record in records():
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, converter.convert(schema, record))
        print(out.getvalue().hex(), flush=True)


def deserialize(args):
    deserializer = AvroDeserializer(client(args))
    context = SerializationContext(args.topic, MessageField.VALUE)
    for line in sys.stdin:
        if line.strip():
            value = deserializer(bytes.fromhex(line.strip()), context)
            print(json.dumps(value, sort_keys=True, default=to_json), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    ser = commands.add_parser("serialize", help="JSON lines -> Confluent-framed Avro, hex")
    ser.add_argument("--registry", required=True, help="the schema registry's URL")
    ser.add_argument("--topic", required=True)
    ser.add_argument("--schema", required=True, help="a file with the Avro schema (JSON)")
    ser.add_argument("--subject-strategy", choices=sorted(STRATEGIES), default="topic")
    ser.add_argument("--retries", type=int, help="the registry client's max.retries")
    ser.set_defaults(run=serialize)

    bare = commands.add_parser("schemaless", help="JSON lines -> bare Avro datums, hex")
    bare.add_argument("--schema", required=True, help="a file with the Avro schema (JSON)")
    bare.set_defaults(run=schemaless)

    de = commands.add_parser("deserialize", help="Confluent-framed Avro, hex -> JSON lines")
    de.add_argument("--registry", required=True, help="the schema registry's URL")
    de.add_argument("--topic", required=True)
    de.add_argument("--retries", type=int, help="the registry client's max.retries")
    de.set_defaults(run=deserialize)

    args = parser.parse_args()
    try:
        args.run(args)
    except SystemExit:
        raise
    except Exception as e:  # the error, and where, for the test that ran the tool
        traceback.print_exc()
        print(f"avro_tool: {args.command} failed: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
