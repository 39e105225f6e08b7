"""The wire format: every event round-trips; bad bytes fail loudly; upcasters lift old payloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, cast

import attrs
import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runfold.conformance.strategies import events
from runfold.kernel import (
    EVENT_TYPES,
    AttributesSet,
    ChildLinked,
    Event,
    EventCodec,
    EventDecodeError,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RetryPolicy,
    RunCreated,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
    correlation_id,
    decode_event,
    decode_events,
    default_codec,
    encode_event,
)
from runfold.kernel.wire import make_converter

CATALOGUE = {
    "run_created",
    "run_started",
    "run_completed",
    "run_failed",
    "cancel_requested",
    "run_cancelled",
    "run_timed_out",
    "attributes_set",
    "progress_recorded",
    "child_linked",
    "log_recorded",
    "step_created",
    "step_started",
    "step_completed",
    "step_failed",
    "step_retrying",
    "step_cancelled",
    "wait_created",
    "wait_completed",
    "hook_created",
    "hook_received",
    "hook_disposed",
    "hook_conflict",
    "run_claimed",
    "run_released",
}
"""The event catalogue (docs/reference/events-and-commands.md)."""

per_type = settings(max_examples=max(settings().max_examples // 4, 10))
"""Round trips run once per event type, so each type gets a share of the profile's examples."""


def test_event_types_are_the_catalogue() -> None:
    assert set(EVENT_TYPES) == CATALOGUE
    for name, cls in EVENT_TYPES.items():
        assert issubclass(cls, Event)
        assert cls.event_type == name
        assert cls.schema_version == (3 if name == "run_created" else 2)
        assert cls.positional


@pytest.mark.parametrize("event_type", sorted(CATALOGUE))
@per_type
@given(data=st.data())
def test_every_event_type_round_trips(event_type: str, data: st.DataObject) -> None:
    event = data.draw(events(types=[event_type]))
    assert type(event) is EVENT_TYPES[event_type]
    name, version, payload = encode_event(event)
    assert (name, version) == (event_type, EVENT_TYPES[event_type].schema_version)
    assert type(payload) is bytes
    assert type(cbor2.loads(payload)) is list
    decoded = decode_event(name, version, payload)
    assert type(decoded) is type(event)
    assert decoded == event
    assert encode_event(decoded) == (name, version, payload), "re-encoding changed the bytes"
    assert EventCodec().decode(name, version, payload) == event


@given(events())
def test_the_compiled_field_reader_unstructures_as_cattrs_does(event: Event) -> None:
    # The encoder reads an event's fields through code written once per class; what it reads
    # must be exactly what cattrs' unstructure of the whole event gives, field by field.
    layout = default_codec._by_class[type(event)]
    assert layout.fields(event) == list(layout.unstructure(event).values())


def _trimmed(values: list[Any], defaults: tuple[Any, ...]) -> list[Any]:
    """The positional form by its definition: trailing fields equal to their defaults (same
    type) left out, one at a time from the last."""
    count = len(values)
    while count and type(values[count - 1]) is type(defaults[count - 1]):
        if values[count - 1] != defaults[count - 1]:
            break
        count -= 1
    return values[:count]


@given(events(), st.integers(min_value=0, max_value=12))
def test_the_compiled_wire_form_leaves_out_trailing_defaults(event: Event, reset: int) -> None:
    # The positional form is written out per class as straight-line comparisons: it must leave
    # out exactly the trailing fields that hold their defaults, here with up to `reset` of the
    # last fields put back to their defaults so that trimming happens.
    fields = attrs.fields(cast(Any, type(event)))
    changes = {
        f.name: f.default
        for f in fields[len(fields) - reset :]
        if reset and f.default is not attrs.NOTHING and f.init
    }
    event = attrs.evolve(cast(Any, event), **changes)
    layout = default_codec._by_class[type(event)]
    assert layout.positional(event) == _trimmed(layout.fields(event), layout.wire_defaults)
    if type(event).positional:
        assert cbor2.loads(encode_event(event)[2]) == layout.positional(event)


@given(events())
def test_decoded_times_are_utc_and_exact(event: Event) -> None:
    decoded = decode_event(*encode_event(event))
    for field in attrs.fields(cast(Any, type(event))):
        value = getattr(decoded, field.name)
        if isinstance(value, datetime):
            assert value.tzinfo is UTC
            assert value == getattr(event, field.name)


def test_events_strategy_covers_every_type() -> None:
    seen: set[type[Event]] = set()
    for name in sorted(CATALOGUE):

        @settings(max_examples=3)
        @given(events(types=[name]))
        def collect(event: Event) -> None:
            seen.add(type(event))

        collect()
    assert seen == set(EVENT_TYPES.values())
    with pytest.raises(ValueError, match="no strategy"):
        events(types=["no_such_event"])


# --- decode errors ------------------------------------------------------------------------------


def reason_of(event_type: str, schema_version: int, payload: bytes) -> str:
    with pytest.raises(EventDecodeError) as raised:
        decode_event(event_type, schema_version, payload)
    error = raised.value
    assert (error.event_type, error.schema_version) == (event_type, schema_version)
    assert error.reason and error.reason in str(error)
    return error.reason


@pytest.mark.parametrize(
    ("version", "payload", "expected"),
    [
        (2, b"", "not CBOR"),
        (2, b"\xff\xff", "not CBOR"),
        (2, b"\x82", "not CBOR"),  # an array header with nothing after it
        (2, cbor2.dumps({"step_id": "s", "attempt": 1}), "not an array"),
        (2, cbor2.dumps("step_started"), "not an array"),
        (2, cbor2.dumps(None), "not an array"),
        (2, cbor2.dumps(["s"]), "expected 2 to 5 fields, found 1"),
        (2, cbor2.dumps(["s", 1, False, None, None, 0]), "expected 2 to 5 fields, found 6"),
        (2, cbor2.dumps(["s", 1, 2]), "after_interruption: expected bool, found int"),
        (2, cbor2.dumps(["s", 1, True, 3]), "retry: "),
        (1, b"\xa1", "not CBOR"),  # a map header with nothing after it
        (1, cbor2.dumps(["s", 1]), "a version 1 payload is a map"),
        (1, cbor2.dumps("step_started"), "not a map or an array"),
        (1, cbor2.dumps(None), "not a map or an array"),
    ],
)
def test_garbage_and_payloads_of_the_wrong_form_are_refused(
    version: int, payload: bytes, expected: str
) -> None:
    assert expected in reason_of("step_started", version, payload)


def test_unknown_types_and_versions_are_refused() -> None:
    payload = encode_event(StepStarted(step_id="s", attempt=1))[2]
    assert "unknown event type" in reason_of("step_begun", 2, payload)
    assert "unknown event type" in reason_of("", 2, payload)
    assert "newer runfold" in reason_of("step_started", 3, payload)
    assert "start at 1" in reason_of("step_started", 0, payload)


WRONG_FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("step_started", {"step_id": "s", "attempt": "1"}, "attempt"),
    ("step_started", {"step_id": "s", "attempt": True}, "attempt"),
    ("step_started", {"step_id": "s", "attempt": 1.0}, "attempt"),
    ("step_started", {"step_id": b"s", "attempt": 1}, "step_id"),
    ("step_started", {"attempt": 1}, "step_id"),
    ("step_completed", {"step_id": "s", "output": "text"}, "output"),
    ("step_failed", {"step_id": "s", "error": b"", "retryable": 1}, "retryable"),
    ("wait_created", {"wait_id": "w", "resume_at": "2026-01-01T00:00:00Z"}, "resume_at"),
    ("wait_created", {"wait_id": "w", "resume_at": 1.5}, "resume_at"),
    ("step_created", {"step_id": "s", "step_name": "n", "input": b"", "retry": 7}, "retry"),
    ("run_created", {"workflow_name": "w", "input": b"", "attributes": 7}, "attributes"),
    ("run_created", {"workflow_name": "w", "input": b"", "attributes": {"k": 1}}, "attributes"),
    ("attributes_set", {"changes": [], "writer": {"kind": "robot"}}, "writer"),
    ("attributes_set", {"changes": 7}, "changes"),
    ("log_recorded", {"level": "debug", "message": "m"}, "level"),
    ("hook_created", {"hook_id": "h", "token": 12345}, "token"),
]


def positional(event_type: str, fields: dict[str, Any]) -> list[Any]:
    """The fields of a version 1 map in declaration order, as far as the last one given."""
    names = [f.name for f in attrs.fields(cast(Any, EVENT_TYPES[event_type]))]
    given = [n for n, name in enumerate(names) if name in fields]
    return [fields.get(name) for name in names[: given[-1] + 1]] if given else []


@pytest.mark.parametrize(("event_type", "payload", "field"), WRONG_FIELDS)
def test_wrong_field_types_are_refused_naming_the_field(
    event_type: str, payload: dict[str, Any], field: str
) -> None:
    assert field in reason_of(event_type, 1, cbor2.dumps(payload))
    if field in payload:  # the same value in the positional form
        assert field in reason_of(event_type, 2, cbor2.dumps(positional(event_type, payload)))


@given(events(), st.data())
def test_any_field_of_the_wrong_type_is_refused(event: Event, data: st.DataObject) -> None:
    name, version, payload = encode_event(event)
    names = [f.name for f in attrs.fields(cast(Any, type(event)))]
    if not names:
        return  # run_started has no fields
    wire = cbor2.loads(payload)
    position = data.draw(st.integers(0, len(names) - 1))
    wire += [None] * (position + 1 - len(wire))  # a field left out at its default, set again
    wire[position] = 1.5  # no event field is a float, nor a union with one
    reason = reason_of(name, version, cbor2.dumps(wire))
    assert names[position] in reason


@pytest.mark.parametrize("field", ["hook_id", "metadata", "is_webhook", "retain_token_until"])
def test_decode_errors_never_show_a_hook_token(field: str) -> None:
    fields = {"hook_id": "h", "token": "SECRET-TOKEN-123", field: 1.5}
    assert "SECRET-TOKEN-123" not in reason_of("hook_created", 1, cbor2.dumps(fields))
    wire = positional("hook_created", fields)
    assert "SECRET-TOKEN-123" not in reason_of("hook_created", 2, cbor2.dumps(wire))


@given(st.sampled_from(sorted(CATALOGUE)), st.sampled_from([1, 2]), st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_event_decode_error(
    event_type: str, version: int, raw: bytes
) -> None:
    try:
        event = decode_event(event_type, version, raw)
    except EventDecodeError:
        return
    assert type(event) is EVENT_TYPES[event_type]


wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.binary(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def decodes_or_is_refused(event_type: str, version: int, wire: Any) -> None:
    """`wire` decodes into an event of `event_type` that round-trips, or is refused cleanly."""
    try:
        event = decode_event(event_type, version, cbor2.dumps(wire))
    except EventDecodeError:
        return
    assert type(event) is EVENT_TYPES[event_type]
    assert decode_event(*encode_event(event)) == event


@given(st.sampled_from(sorted(CATALOGUE)), st.data())
def test_arbitrary_maps_decode_or_raise_event_decode_error(
    event_type: str, data: st.DataObject
) -> None:
    names = [f.name for f in attrs.fields(cast(Any, EVENT_TYPES[event_type]))]
    keys = st.sampled_from(names) if names else st.text(max_size=4)
    wire = data.draw(st.dictionaries(keys, wire_values, max_size=len(names) + 1))
    decodes_or_is_refused(event_type, 1, wire)


@given(st.sampled_from(sorted(CATALOGUE)), st.data())
def test_arbitrary_arrays_decode_or_raise_event_decode_error(
    event_type: str, data: st.DataObject
) -> None:
    count = len(attrs.fields(cast(Any, EVENT_TYPES[event_type])))
    wire = data.draw(st.lists(wire_values, max_size=count + 1))
    decodes_or_is_refused(event_type, 2, wire)


# --- upcasters ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Renamed(Event):
    """A test event at schema version 3: v1 had `name`, v2 renamed it `title`, v3 added `count`."""

    event_type: ClassVar[str] = "test_renamed"
    schema_version: ClassVar[int] = 3
    title: str
    count: int = 0


def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {"title": data["name"]}


def v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "count": len(data["title"])}


def renamed_codec() -> EventCodec:
    codec = EventCodec(event_types={Renamed.event_type: Renamed})
    codec.register_upcaster("test_renamed", 1, v1_to_v2)
    codec.register_upcaster("test_renamed", 2, v2_to_v3)
    return codec


@given(st.text(max_size=20))
def test_upcasters_lift_old_payloads(title: str) -> None:
    codec = renamed_codec()
    assert codec.decode("test_renamed", 1, cbor2.dumps({"name": title})) == Renamed(
        title=title, count=len(title)
    )
    assert codec.decode("test_renamed", 2, cbor2.dumps({"title": title})) == Renamed(
        title=title, count=len(title)
    )
    current = Renamed(title=title, count=99)
    assert codec.encode(current)[:2] == ("test_renamed", 3)
    assert codec.decode(*codec.encode(current)) == current


def test_upcaster_registration_and_failures() -> None:
    codec = EventCodec(event_types={Renamed.event_type: Renamed})
    # Only a gap-free chain of upcasters below the current version lifts a payload.
    codec.register_upcaster("test_renamed", 2, v2_to_v3)
    with pytest.raises(EventDecodeError, match="no upcaster from version 1"):
        codec.decode("test_renamed", 1, cbor2.dumps({"name": "x"}))
    codec.register_upcaster("test_renamed", 1, v1_to_v2)
    assert codec.decode("test_renamed", 1, cbor2.dumps({"name": "x"})) == Renamed(
        title="x", count=1
    )
    for version in (0, 3, 4):
        with pytest.raises(ValueError, match="upcaster lifts a version below"):
            codec.register_upcaster("test_renamed", version, v1_to_v2)
    with pytest.raises(ValueError, match="unknown event type"):
        codec.register_upcaster("run_started", 1, v1_to_v2)
    with pytest.raises(ValueError, match="upcaster lifts a version below"):
        default_codec.register_upcaster("run_started", 2, v1_to_v2)  # run_started is at 2
    # An old payload the upcaster cannot lift is undecodable, not a crash.
    with pytest.raises(EventDecodeError, match="upcaster from version 1 failed"):
        codec.decode("test_renamed", 1, cbor2.dumps({"title": "already renamed?"}))
    codec.register_upcaster("test_renamed", 2, lambda data: "neither")
    with pytest.raises(EventDecodeError, match="did not return a map or an array"):
        codec.decode("test_renamed", 2, cbor2.dumps({"title": "x"}))
    with pytest.raises(EventDecodeError, match="newer runfold"):
        codec.decode("test_renamed", 4, cbor2.dumps({"title": "x"}))
    # Other codecs are untouched by registrations on this one.
    with pytest.raises(EventDecodeError, match="no upcaster from version 1"):
        EventCodec(event_types={Renamed.event_type: Renamed}).decode(
            "test_renamed", 1, cbor2.dumps({"name": "x"})
        )
    with pytest.raises(EventDecodeError, match="unknown event type"):
        default_codec.decode("test_renamed", 3, cbor2.dumps({"title": "x"}))


@attrs.frozen(kw_only=True)
class Reordered(Event):
    """A positional test event at version 3: v2 (positional too) was `[name, size]`."""

    event_type: ClassVar[str] = "test_reordered"
    schema_version: ClassVar[int] = 3
    positional: ClassVar[bool] = True
    size: int
    name: str = ""


def test_an_upcaster_of_a_positional_version_gets_and_may_return_a_list() -> None:
    codec = EventCodec(event_types={Reordered.event_type: Reordered})
    codec.register_upcaster("test_reordered", 1, lambda data: [data["name"], data["size"]])
    codec.register_upcaster("test_reordered", 2, lambda data: [data[1], data[0]])
    expected = Reordered(size=3, name="abc")
    assert codec.decode("test_reordered", 2, cbor2.dumps(["abc", 3])) == expected
    assert codec.decode("test_reordered", 1, cbor2.dumps({"name": "abc", "size": 3})) == expected
    assert codec.encode(expected) == ("test_reordered", 3, cbor2.dumps([3, "abc"]))
    rows = [cbor2.dumps(["abc", 3]), cbor2.dumps({"name": "abc", "size": 3}), cbor2.dumps([3])]
    assert codec.decode_many(["test_reordered"] * 3, [2, 1, 3], rows) == [
        expected,
        expected,
        Reordered(size=3),
    ]
    with pytest.raises(EventDecodeError, match="not a map"):
        codec.decode("test_reordered", 2, cbor2.dumps(7))


def test_a_map_layout_type_keeps_writing_maps() -> None:
    current = Renamed(title="t", count=2)
    name, version, payload = renamed_codec().encode(current)
    assert cbor2.loads(payload) == {"title": "t", "count": 2}
    with pytest.raises(EventDecodeError, match="payload is not a map"):
        renamed_codec().decode(name, version, cbor2.dumps(["t", 2]))


def test_positional_payloads_leave_out_only_trailing_defaults() -> None:
    def wire(event: Event) -> Any:
        return cbor2.loads(encode_event(event)[2])

    assert wire(StepCreated(step_id="s", step_name="n", input=b"")) == ["s", "n", b""]
    assert wire(StepFailed(step_id="s", error=b"e")) == ["s", b"e"]
    assert wire(StepFailed(step_id="s", error=b"e", retryable=True)) == ["s", b"e", True]
    assert wire(HookCreated(hook_id="h", token="t", is_webhook=True)) == ["h", "t", None, True]
    assert wire(AttributesSet(changes=(), write_id="w")) == [[], {"kind": "workflow"}, "w"]
    # A field left out decodes to its default, as if it had been written.
    assert decode_event("step_failed", 2, cbor2.dumps(["s", b"e", False])) == StepFailed(
        step_id="s", error=b"e"
    )
    assert decode_event("attributes_set", 2, cbor2.dumps([[]])) == AttributesSet(changes=())


# step_started as stored: two elements before it had trailing ones, a map at version 1.
STARTED_BEFORE_THE_MARKERS = bytes.fromhex("8262733102")
STARTED_AS_A_MAP = bytes.fromhex("a267737465705f696462733167617474656d707402")
STARTED_AFTER_AN_INTERRUPTION = bytes.fromhex("8362733102f5")
STARTED_WITH_A_NEW_POLICY = bytes.fromhex(
    "8462733102f4a56c6d61785f617474656d7074730570696e697469616c5f696e74657276616c1a001e8480"
    "736261636b6f66665f636f656666696369656e74fb40000000000000006c6d61785f696e74657276616cf6"
    "78196e6f6e5f726574727961626c655f6572726f725f636f64657380"
)


def test_step_started_gains_its_markers_as_optional_trailing_elements() -> None:
    """Rows written before the markers read as before; the markers' wire layout is pinned."""
    plain = StepStarted(step_id="s1", attempt=2)
    assert decode_event("step_started", 2, STARTED_BEFORE_THE_MARKERS) == plain
    assert decode_event("step_started", 1, STARTED_AS_A_MAP) == plain
    assert encode_event(plain) == ("step_started", 2, STARTED_BEFORE_THE_MARKERS)
    assert repr(plain) == "StepStarted(step_id='s1', attempt=2)"  # as before the markers

    interrupted = StepStarted(step_id="s1", attempt=2, after_interruption=True)
    assert encode_event(interrupted) == ("step_started", 2, STARTED_AFTER_AN_INTERRUPTION)
    assert decode_event("step_started", 2, STARTED_AFTER_AN_INTERRUPTION) == interrupted
    assert "after_interruption=True" in repr(interrupted)

    policy = RetryPolicy(max_attempts=5, initial_interval=timedelta(seconds=2))
    changed = StepStarted(step_id="s1", attempt=2, retry=policy)
    assert encode_event(changed) == ("step_started", 2, STARTED_WITH_A_NEW_POLICY)
    assert decode_event("step_started", 2, STARTED_WITH_A_NEW_POLICY) == changed
    assert repr(changed).endswith(f"retry={policy!r})")
    # Together, in one bulk decode, with the rows of before.
    rows = [STARTED_AS_A_MAP, STARTED_BEFORE_THE_MARKERS, STARTED_AFTER_AN_INTERRUPTION]
    rows.append(STARTED_WITH_A_NEW_POLICY)
    assert decode_events(["step_started"] * 4, [1, 2, 2, 2], rows) == [
        plain,
        plain,
        interrupted,
        changed,
    ]


@given(st.lists(events(), max_size=12), st.data())
def test_decoding_rows_together_matches_decoding_each(
    rows: list[Event], data: st.DataObject
) -> None:
    encoded = [encode_event(event) for event in rows]
    # Some rows as an older runfold wrote them: version 1, a map by field name.
    for n, (name, _, _) in enumerate(encoded):
        if written_before_queues(rows[n]) and data.draw(st.booleans()):
            encoded[n] = (name, 1, version_1_payload(rows[n]))
    types, versions, payloads = columns(encoded)
    assert default_codec.decode_many(types, versions, payloads) == rows
    assert [decode_event(*row) for row in encoded] == rows


def columns(rows: list[tuple[str, int, bytes]]) -> tuple[list[str], list[int], list[bytes]]:
    """The type, version and payload columns of stored rows."""
    return [row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows]


_QUEUE_FIELDS = ("queue_name", "priority", "dedup_id")
"""What `run_created` 3 added."""


def written_before_queues(event: Event) -> bool:
    """Whether a runfold before queues could have written `event` (a run on no queue)."""
    return not isinstance(event, RunCreated) or (
        event.queue_name,
        event.priority,
        event.dedup_id,
    ) == (
        None,
        0,
        None,
    )


def version_1_payload(event: Event) -> bytes:
    """An event's payload as runfold wrote it before the positional form: every field in a map
    (of those it had then: no queue's)."""
    fields = make_converter().unstructure(event)
    if isinstance(event, RunCreated):
        for name in _QUEUE_FIELDS:
            del fields[name]
    return cbor2.dumps(fields)


def test_decoding_rows_together_names_the_first_bad_one() -> None:
    good = encode_event(StepStarted(step_id="s", attempt=1))
    rows = [good, ("step_started", 2, cbor2.dumps(["s", "one"])), ("no_such", 2, good[2])]
    types, versions, payloads = columns(rows)
    with pytest.raises(EventDecodeError, match="attempt: expected int") as caught:
        default_codec.decode_many(types, versions, payloads)
    assert caught.value.event_type == "step_started"
    with pytest.raises(EventDecodeError, match="unknown event type"):
        default_codec.decode_many(types[::2], versions[::2], payloads[::2])
    with pytest.raises(ValueError, match="a type, a version and a payload for each row"):
        default_codec.decode_many(types, versions[:2], payloads)
    assert default_codec.decode_many([], [], []) == []


def decode_both_ways(rows: list[tuple[str, int, bytes]]) -> list[str]:
    """The reason each read path gives for `rows`: one row at a time, and all rows together."""
    reasons = []
    with pytest.raises(EventDecodeError) as alone:
        [decode_event(*row) for row in rows]
    reasons.append(alone.value.reason)
    with pytest.raises(EventDecodeError) as together:
        decode_events(*columns(rows))
    reasons.append(together.value.reason)
    return reasons


AFTER_ITEM = "payload has bytes after its CBOR item"
TRAILERS = {  # what follows a whole payload, and the reason it is refused with
    "an item": (cbor2.dumps(["t", 2]), AFTER_ITEM),
    "one byte": (b"\x00", AFTER_ITEM),
    "a bulk read's own separator and end": (b"\xf7\xff", AFTER_ITEM),
    "a break": (b"\xff", "not CBOR: break code encountered"),
    "half an item": (b"\x82\x01", AFTER_ITEM),
}


@pytest.mark.parametrize(("trailer", "reason"), TRAILERS.values(), ids=TRAILERS)
@pytest.mark.parametrize("where", [0, 1, 2], ids=["first row", "middle row", "last row"])
def test_bytes_after_a_payload_are_a_decode_error(trailer: bytes, reason: str, where: int) -> None:
    # CBOR readers stop after the first item: a corrupted tail would go unnoticed, and joined
    # with the next payload it would shift every row after it.
    rows = [encode_event(StepStarted(step_id="s", attempt=n)) for n in (1, 2, 3)]
    name, version, payload = rows[where]
    rows[where] = (name, version, payload + trailer)
    for found in decode_both_ways(rows):
        assert found.startswith(reason), found


def test_a_payload_cut_short_is_a_decode_error() -> None:
    name, version, payload = encode_event(StepStarted(step_id="s", attempt=1))
    for cut in range(len(payload)):
        # The marker after the item is read as part of it: an error either way.
        for reason in decode_both_ways([(name, version, payload[:cut])]):
            assert reason.startswith(("not CBOR", AFTER_ITEM)), (cut, reason)


def _map(*pairs: tuple[str, Any]) -> bytes:
    """A CBOR map of `pairs` as written, duplicate keys included (cbor2 cannot write one)."""
    return bytes([0xA0 + len(pairs)]) + b"".join(cbor2.dumps(k) + cbor2.dumps(v) for k, v in pairs)


def test_a_duplicate_map_key_is_a_decode_error() -> None:
    doubled = _map(("step_id", "s"), ("attempt", 1), ("attempt", 2))
    assert cbor2.loads(doubled) == {"step_id": "s", "attempt": 2}  # what a lenient reader sees
    for reason in decode_both_ways([("step_started", 1, doubled)]):
        assert "Duplicate map key: 'attempt'" in reason
    # A map inside a positional payload: a run's attributes.
    name, version, payload = encode_event(
        RunCreated(workflow_name="wf", input=b"", attributes={"k": "v"})
    )
    fields = cbor2.loads(payload)
    assert {"k": "v"} in fields
    spliced = cbor2.dumps(fields).replace(cbor2.dumps({"k": "v"}), _map(("k", "v"), ("k", "w")))
    for reason in decode_both_ways([(name, version, spliced)]):
        assert "Duplicate map key: 'k'" in reason
    assert decode_event(name, version, payload) == RunCreated(
        workflow_name="wf", input=b"", attributes={"k": "v"}
    )


# --- correlation ids ----------------------------------------------------------------------------

CORRELATED_BY: dict[type[Event], str] = {
    StepCreated: "step_id",
    StepStarted: "step_id",
    StepCompleted: "step_id",
    StepFailed: "step_id",
    StepRetrying: "step_id",
    StepCancelled: "step_id",
    LogRecorded: "step_id",
    WaitCreated: "wait_id",
    WaitCompleted: "wait_id",
    HookCreated: "hook_id",
    HookReceived: "hook_id",
    HookDisposed: "hook_id",
    HookConflict: "hook_id",
    AttributesSet: "write_id",
    ProgressRecorded: "progress_id",
    ChildLinked: "reference_id",
}
"""The entity id each event belongs to; run-level events have none."""


@pytest.mark.parametrize("event_type", sorted(CATALOGUE))
@per_type
@given(data=st.data())
def test_correlation_id_names_the_entity(event_type: str, data: st.DataObject) -> None:
    event = data.draw(events(types=[event_type]))
    field = CORRELATED_BY.get(type(event))
    expected = None if field is None else getattr(event, field)
    assert correlation_id(event) == expected
    assert correlation_id(decode_event(*encode_event(event))) == expected


def test_correlation_ids_of_run_events_are_none() -> None:
    run_level = set(EVENT_TYPES.values()) - set(CORRELATED_BY)
    assert {cls.event_type for cls in run_level} == {
        "run_created",
        "run_started",
        "run_completed",
        "run_failed",
        "cancel_requested",
        "run_cancelled",
        "run_timed_out",
        "run_claimed",
        "run_released",
    }
    assert correlation_id(StepStarted(step_id="s1", attempt=1)) == "s1"
    assert correlation_id(LogRecorded(level="info", message="m")) is None
    assert correlation_id(AttributesSet(changes=(), write_id="w1")) == "w1"


def test_log_recorded_gains_its_log_id_as_an_optional_trailing_element() -> None:
    """Rows written before `log_id` read as before (both wire forms); the new layout is pinned."""
    plain = LogRecorded(level="info", message="m", step_id="s1")
    before = cbor2.dumps(["info", "m", "s1"])
    assert encode_event(plain) == ("log_recorded", 2, before)  # the same bytes as before
    assert decode_event("log_recorded", 2, before) == plain
    as_map = cbor2.dumps({"level": "info", "message": "m", "step_id": "s1", "data": None})
    assert decode_event("log_recorded", 1, as_map) == plain
    assert "log_id" not in repr(plain)

    named = LogRecorded(level="info", message="m", log_id="line-1")
    with_id = cbor2.dumps(["info", "m", None, None, "line-1"])
    assert encode_event(named) == ("log_recorded", 2, with_id)
    assert decode_event("log_recorded", 2, with_id) == named
    assert repr(named).endswith("log_id='line-1')")
    assert decode_events(["log_recorded"] * 3, [1, 2, 2], [as_map, before, with_id]) == [
        plain,
        plain,
        named,
    ]
    with pytest.raises(EventDecodeError, match="log_id"):
        decode_event("log_recorded", 2, cbor2.dumps(["info", "m", None, None, 7]))


def test_run_created_at_version_2_reads_as_on_no_queue() -> None:
    """A `run_created` stored before queues (version 2, and version 1's map) decodes with no
    queue; a version 2 payload with more fields than version 2 had is refused, not misread."""
    before = RunCreated(workflow_name="wf", input=b"in", attributes={"k": "v"}, spec_version=1)
    _, _, current = encode_event(before)
    fields = cbor2.loads(current)
    assert len(fields) <= 10
    assert decode_event("run_created", 2, cbor2.dumps(fields)) == before
    as_map = {"workflow_name": "wf", "input": b"in", "attributes": {"k": "v"}}
    assert decode_event("run_created", 1, cbor2.dumps(as_map)) == before
    queued = RunCreated(workflow_name="wf", input=b"", queue_name="q", priority=2, dedup_id="d")
    name, version, payload = encode_event(queued)
    assert (name, version) == ("run_created", 3)
    assert decode_event(name, version, payload) == queued
    assert "version 2 had 10" in reason_of("run_created", 2, payload)
    smuggled = cbor2.dumps({**as_map, "queue_name": "q"})
    with pytest.raises(EventDecodeError, match="a queue field, which version 2 did not have"):
        decode_event("run_created", 1, smuggled)
