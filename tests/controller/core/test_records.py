"""Record payloads: compact JSON of the fields, byte for byte what the log format documents,
and read back as the same record."""

from __future__ import annotations

import ast
import base64
import dataclasses
import functools
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ops.compiled import source_file
from pidctl.controller.core import records
from pidctl.controller.core.records import (
    RECORD_TYPES,
    TYPE_IDS,
    BrokerRegistered,
    ProducerIdsGranted,
    Record,
    TransactionalIdUpdated,
    decode_payload,
    encode_payload,
    new_cluster_id,
)

_text = st.text(max_size=20)
_int = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@functools.cache
def _annotations() -> dict[str, dict[str, str]]:
    """Each record class's field annotations as written in its source: compiled, the
    classes keep only what mypyc leaves of them (``type`` for ``str | None``)."""
    return {
        node.name: {
            item.target.id: ast.unparse(item.annotation)
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        }
        for node in ast.parse(source_file(records).read_text()).body
        if isinstance(node, ast.ClassDef)
    }


def _strategy(cls: type[Record]) -> st.SearchStrategy[Record]:
    fields: dict[str, st.SearchStrategy[object]] = {}
    annotations = _annotations()[cls.__name__]
    for f in dataclasses.fields(cls):
        kind = annotations[f.name]
        if "tuple" in kind:
            fields[f.name] = st.lists(_text, max_size=3).map(tuple)
        elif "str" in kind:
            optional = "None" in kind
            fields[f.name] = st.one_of(st.none(), _text) if optional else _text
        elif kind == "bool":
            fields[f.name] = st.booleans()
        else:
            fields[f.name] = _int
    return st.builds(cls, **fields)


_records = st.one_of(*(_strategy(cls) for cls in RECORD_TYPES.values()))


@given(_records)
def test_payload_is_the_documented_compact_json_and_reads_back(record: Record) -> None:
    payload = encode_payload(record)
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    assert payload == json.dumps(fields, separators=(",", ":")).encode()
    assert decode_payload(TYPE_IDS[type(record)], payload) == record


def test_payload_keeps_the_declaration_order_of_the_fields() -> None:
    granted = ProducerIdsGranted(3, 7, 1000, 2000, "User:alice", "broker-3")
    assert encode_payload(granted) == (
        b'{"broker_id":3,"broker_epoch":7,"first_producer_id":1000,"next_producer_id":2000,'
        b'"principal":"User:alice","client_id":"broker-3","holder":"broker"}'
    )
    registered = BrokerRegistered(1, "inc", 5, None, ("PLAINTEXT://h:9092",))
    assert json.loads(encode_payload(registered))["listeners"] == ["PLAINTEXT://h:9092"]
    updated = TransactionalIdUpdated("tx-é", 1, 0, -1, -1, 60000, 0)
    assert b"tx-\\u00e9" in encode_payload(updated)  # ASCII only, as json.dumps


def test_no_record_can_change_once_made() -> None:
    # A frozen dataclass, or (the records made on every request: records.py says why) one
    # whose every field is Final: mypy refuses any assignment, and compiled so does the class.
    annotations = _annotations()
    for cls in RECORD_TYPES.values():
        final = all(kind.startswith("Final[") for kind in annotations[cls.__name__].values())
        frozen = getattr(cls, "__dataclass_params__").frozen  # noqa: B009 (not in its type)
        assert frozen or final, cls.__name__
    granted = ProducerIdsGranted(3, 7, 1000, 2000)
    assert granted == ProducerIdsGranted(3, 7, 1000, 2000)
    assert hash(granted) == hash(ProducerIdsGranted(3, 7, 1000, 2000))
    assert dataclasses.replace(granted, broker_id=4).broker_id == 4
    if not (records.__file__ or "").endswith(".py"):  # the compiled build
        with pytest.raises(AttributeError):
            granted.broker_id = 4  # type: ignore[misc]


def test_a_new_cluster_id_is_a_uuid_without_a_dash_as_kafka_draws_one() -> None:
    """Kafka's ``Uuid.randomUuid()`` (KAFKA-20072): 22 URL-safe base64 characters, never a
    ``-``, which would read as an option on a command line. Three draws in ten would
    have one, so 2,000 draws without any show the redraw."""
    ids = [new_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if "-" in i]
    assert all(len(i) == 22 for i in ids)
    assert all(uuid.UUID(bytes=base64.urlsafe_b64decode(i + "==")).version == 4 for i in ids)
    assert len(set(ids)) == len(ids)
