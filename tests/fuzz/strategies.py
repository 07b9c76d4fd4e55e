"""Hypothesis strategies built from the proto descriptors: any message of the contract, its bytes, and those
bytes damaged the ways a hostile or broken client damages them (random, truncated, bit-flipped, spliced,
oversized).

Every field is drawn over its whole wire range (any int64, NaN and infinities, unpaired surrogates turned into
invalid UTF-8 by the mutations, enum numbers the contract does not name), because the handlers must
validate, not trust, what the types allow.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

_F = FieldDescriptor
_INT_RANGES = {
    _F.TYPE_INT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _F.TYPE_INT64: (-(2**63), 2**63 - 1),
    _F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    _F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _F.TYPE_UINT32: (0, 2**32 - 1),
    _F.TYPE_FIXED32: (0, 2**32 - 1),
    _F.TYPE_UINT64: (0, 2**64 - 1),
    _F.TYPE_FIXED64: (0, 2**64 - 1),
}
# the strings a scheduler sees: ids, queue names, models; plus hostile ones
_TEXT = st.one_of(
    st.sampled_from(["", "a", "team-a", "org/team-a", "A100", "job-1", " ", "../../etc/passwd", "x" * 300]),
    st.text(max_size=40),
)


def _small_ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Mostly the small values handlers branch on, sometimes the extremes of the type."""
    edges = [v for v in (0, 1, -1, 2, 3, 8, low, high) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(max(low, -1000), min(high, 1000)), st.integers(low, high))


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INT_RANGES:
        return _small_ints(*_INT_RANGES[kind])
    if kind == _F.TYPE_BOOL:
        return st.booleans()
    if kind in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        width = 32 if kind == _F.TYPE_FLOAT else 64
        return st.one_of(
            st.sampled_from([0.0, 0.5, 1.0, 4.0, -1.0, 100.0]),
            st.floats(-1e6, 1e6, width=width),
            st.floats(allow_nan=True, allow_infinity=True, width=width),
        )
    if kind == _F.TYPE_STRING:
        return _TEXT
    if kind == _F.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == _F.TYPE_ENUM:
        named = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(named), st.integers(-5, 50))  # proto3 enums are open
    raise TypeError(f"no strategy for field type {kind} ({field.full_name})")


def messages(descriptor: Descriptor, depth: int = 3) -> st.SearchStrategy[Message]:
    """Any message of this type: every field may be unset, set, or repeated a few times; nesting to `depth`."""
    cls = GetMessageClass(descriptor)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.type == _F.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                key_field, value_field = (
                    field.message_type.fields_by_name["key"],
                    field.message_type.fields_by_name["value"],
                )
                value = (
                    messages(value_field.message_type, depth - 1)
                    if value_field.type == _F.TYPE_MESSAGE
                    else scalar(value_field)
                )
                fields[field.name] = st.dictionaries(scalar(key_field), value, max_size=3) if depth > 0 else st.just({})
                continue
            if depth <= 0:
                continue
            element: st.SearchStrategy[Any] = messages(field.message_type, depth - 1)
        else:
            element = scalar(field)
        if field.is_repeated:
            fields[field.name] = st.lists(element, max_size=4)
        else:
            fields[field.name] = st.none() | element

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = cls()
        oneofs_set: set[str] = set()
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is None or value == [] or value == {}:
                continue
            field = descriptor.fields_by_name[name]
            group = field.containing_oneof
            if group is not None and group.name in oneofs_set:  # one member of a oneof at most
                continue
            if group is not None:
                oneofs_set.add(group.name)
            target = getattr(message, name) if field.is_repeated or field.type == _F.TYPE_MESSAGE else None
            if field.type == _F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(item, Message):
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            elif field.is_repeated and field.type == _F.TYPE_MESSAGE:
                for item in value:
                    target.add().CopyFrom(item)
            elif field.is_repeated:
                target.extend(value)
            elif field.type == _F.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return build()


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """Valid bytes damaged: truncated, bits flipped, bytes inserted or deleted, a chunk repeated, garbage appended."""
    buffer = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "set", "insert", "delete", "repeat", "append"]))
        if kind in ("truncate", "flip", "set", "delete", "repeat") and not buffer:
            kind = "append"
        if kind == "truncate":
            del buffer[draw(st.integers(0, len(buffer) - 1)) :]
        elif kind == "flip":
            at = draw(st.integers(0, len(buffer) - 1))
            buffer[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            buffer[draw(st.integers(0, len(buffer) - 1))] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0xC0]))
        elif kind == "insert":
            buffer[draw(st.integers(0, len(buffer))) : 0] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            at = draw(st.integers(0, len(buffer) - 1))
            del buffer[at : at + draw(st.integers(1, 4))]
        elif kind == "repeat":
            at = draw(st.integers(0, len(buffer) - 1))
            buffer[at:at] = buffer[at : at + draw(st.integers(1, 16))] * draw(st.integers(1, 4))
        else:
            buffer.extend(draw(st.binary(min_size=1, max_size=16)))
    return bytes(buffer)


def payloads(descriptor: Descriptor, *, oversized: bool = False) -> st.SearchStrategy[bytes]:
    """What a hostile client sends for a message of this type: valid encodings, damaged ones, random bytes."""
    valid = messages(descriptor).map(lambda message: message.SerializeToString())
    choices = [valid, valid.flatmap(mutated), st.binary(max_size=256)]
    if oversized:  # a long run of one field: a length-delimited value far beyond anything real
        choices.append(st.integers(64 * 1024, 512 * 1024).map(lambda size: b"\x0a" + _varint(size) + b"a" * size))
    return st.one_of(*choices)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
