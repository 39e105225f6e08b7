"""The wire format: cattrs unstructures an event, cbor2 encodes it.

A stored event is `(type, schema_version, payload)`. The payload of a positional event type
(every type of runfold's catalogue, from schema version 2) is a CBOR array of its fields in
declaration order, trailing fields that hold their defaults left out; otherwise it is a CBOR map
keyed by field name. Times travel as integer microseconds since the Unix epoch (exact, and
faster than CBOR's date tags); durations as integer microseconds; a `Writer` as a small tagged
map. Upcasters lift a payload written at an older `schema_version` of its type, one version at
a time, before it is structured.

Reads decode in bulk (`EventCodec.decode_many`): the payloads are joined into one CBOR array,
so one call of the CBOR decoder reads them all, and each item is structured by a function
generated once per event type and schema version (`fast.compile_decoder`).

Decoding is strict (`wire.one_item`): a payload is exactly one CBOR item, and a map in it names
each key once, so a corrupted tail or a doubled field is an `EventDecodeError`, never read past.
The primitives and each class's layout are in `runfold.kernel.wire`.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import call
from typing import Any, TypeAlias

import attrs
import cbor2

from runfold.kernel.errors import EventDecodeError
from runfold.kernel.events import (
    EVENT_TYPES,
    AttributesSet,
    ChildLinked,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.kernel.fast import compile_decoder
from runfold.kernel.wire import (
    REQUIRED,
    Layout,
    compile_fields,
    compile_wire,
    load_payloads,
    make_converter,
    one_item,
)

__all__ = [
    "EventCodec",
    "Upcaster",
    "correlation_id",
    "decode_event",
    "decode_events",
    "default_codec",
    "encode_event",
]

_dumps = cbor2.dumps

Upcaster: TypeAlias = Callable[[Any], Any]
"""Turns the unstructured payload of schema version N into that of version N + 1.

It receives the payload as stored at version N (a dict for a map, a list for an array) or as
the upcaster before it returned it, and returns a dict keyed by field name or a list of the
fields in declaration order."""


def _map_form(data: Any) -> Any:
    """Upcaster of every catalogue type from schema version 1 (a map by field name) to 2 (the
    positional form): the fields are the same, so the map is structured by name as it is."""
    if type(data) is not dict:
        raise TypeError("a version 1 payload is a map")
    return data


_RUN_CREATED_V2_FIELDS = 10
"""How many fields `run_created` had at schema version 2 (never edit)."""


def _before_queues(data: Any) -> Any:
    """`run_created` 2 → 3: version 3 added `queue_name`, `priority` and `dedup_id` last, so
    a version 2 payload is one of version 3 with the three at their defaults (none left in)."""
    if type(data) is list and len(data) > _RUN_CREATED_V2_FIELDS:
        raise TypeError(f"{len(data)} fields, where version 2 had {_RUN_CREATED_V2_FIELDS}")
    if type(data) is dict and {"queue_name", "priority", "dedup_id"} & data.keys():
        raise TypeError("a queue field, which version 2 did not have")
    return data


_CATALOGUE_UPCASTERS: dict[tuple[str, int], Upcaster] = {
    **{(name, 1): _map_form for name in EVENT_TYPES},
    ("run_created", 2): _before_queues,
}
"""The upcasters runfold ships for its own event types, by (type, version lifted from)."""


def _is_wire_form(data: Any) -> bool:
    return type(data) is dict or type(data) is list


def _lifted(chain: Sequence[Upcaster], layout: Layout) -> Callable[[Any], Event]:
    """The unchecked decoder of an older schema version: its upcasters, then the structure."""

    def decode(data: Any) -> Event:
        for upcaster in chain:
            if not _is_wire_form(data):
                raise TypeError("not a map or an array")
            data = upcaster(data)
        return layout.structure(data)

    return decode


class EventCodec:
    """Encodes and decodes events; holds the upcaster registry.

    Most users need only the module functions `encode_event`/`decode_event`, which use
    `default_codec`. A runtime that evolves an event's schema registers an upcaster there.
    """

    def __init__(self, event_types: Mapping[str, type[Event]] = EVENT_TYPES) -> None:
        self._types = dict(event_types)
        self._converter = make_converter()
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._layouts = {name: self._layout_of(cls) for name, cls in self._types.items()}
        self._by_class = {layout.cls: layout for layout in self._layouts.values()}
        # Every append encodes its events: by class, the type, version and wire form at once.
        self._encoders: dict[type[Event], tuple[str, int, Callable[[Event], Any]]] = {
            cls: (
                cls.event_type,
                cls.schema_version,
                layout.positional if cls.positional else layout.unstructure,
            )
            for cls, layout in self._by_class.items()
        }
        # The hot path, by (type, schema version): an unchecked decoder of the decoded CBOR
        # that raises on anything wrong; the checked path then says precisely what.
        self._fast: dict[tuple[str, int], Callable[[Any], Event]] = {}
        self._current = {
            name: layout.by_position if layout.cls.positional else layout.by_name
            for name, layout in self._layouts.items()
        }
        self._versions = {name: cls.schema_version for name, cls in self._types.items()}
        for name, decoder in self._current.items():
            self._fast[(name, self._versions[name])] = decoder
        for (name, version), upcaster in _CATALOGUE_UPCASTERS.items():
            if EVENT_TYPES[name] is self._types.get(name):
                self.register_upcaster(name, version, upcaster)

    def _layout_of(self, cls: type[Event]) -> Layout:
        fields = attrs.fields(cls)  # type: ignore[arg-type]
        hints = typing.get_type_hints(cls)
        unstructure = self._converter.unstructure
        wire_defaults = {
            f.name: unstructure(f.default, unstructure_as=hints[f.name])
            for f in fields
            if f.default is not attrs.NOTHING
        }
        post = {f.name: f.converter for f in fields if callable(f.converter)}
        hook = self._converter.get_structure_hook

        def decoder(positional: bool) -> Callable[[Any], Event]:
            return compile_decoder(
                cls, hook, post, wire_defaults=wire_defaults, positional=positional
            )

        defaults = tuple(wire_defaults.get(f.name, REQUIRED) for f in fields)
        unstructure_hook = self._converter.get_unstructure_hook
        return Layout(
            cls=cls,
            unstructure=unstructure_hook(cls),
            by_name=decoder(False),
            by_position=decoder(True),
            wire_defaults=defaults,
            fields=compile_fields(cls, hints, unstructure_hook),
            positional=compile_wire(cls, hints, unstructure_hook, defaults),
        )

    def register_upcaster(self, event_type: str, from_version: int, upcaster: Upcaster) -> None:
        """Register how to lift `event_type` payloads from `from_version` to `from_version + 1`.

        `upcaster` gets the payload as stored at `from_version` (a dict for a map, a list for an
        array), or as the upcaster below it returned it, and returns the payload of the next
        version as a dict keyed by field name or a list of the fields in declaration order.
        """
        if event_type not in self._types:
            raise ValueError(f"unknown event type {event_type!r}")
        current = self._types[event_type].schema_version
        if from_version < 1 or from_version >= current:
            raise ValueError(
                f"{event_type}: an upcaster lifts a version below the current "
                f"{current}, not {from_version}"
            )
        self._upcasters[(event_type, from_version)] = upcaster
        # Each older version whose whole chain is now registered gets a fast path.
        layout = self._layouts[event_type]
        chain: list[Upcaster] = []
        for version in range(current - 1, 0, -1):
            below = self._upcasters.get((event_type, version))
            if below is None:
                break
            chain.insert(0, below)
            self._fast[(event_type, version)] = _lifted(tuple(chain), layout)

    def encode(self, event: Event) -> tuple[str, int, bytes]:
        """`(type, schema_version, payload)` of an event."""
        found = self._encoders.get(type(event))
        if found is None:
            raise TypeError(f"not a registered event: {type(event).__name__}")
        event_type, version, wire = found
        return event_type, version, _dumps(wire(event))

    def decode(self, event_type: str, schema_version: int, payload: bytes) -> Event:
        """The event stored as `(event_type, schema_version, payload)`.

        Raises `EventDecodeError` for an unknown type, a version newer than this runfold, or a
        payload that is not the CBOR map or array of that type and version.
        """
        fast = self._fast.get((event_type, schema_version))
        if fast is not None:
            try:
                return fast(one_item(payload))
            except Exception:
                pass  # the checked path below says precisely what is wrong
        return self._decode_checked(event_type, schema_version, payload)

    def decode_many(
        self, types: Sequence[str], versions: Sequence[int], payloads: Sequence[bytes]
    ) -> list[Event]:
        """The events stored as the rows `(types[i], versions[i], payloads[i])`, decoded together.

        The same events as `decode` on each row, faster: one call of the CBOR decoder reads
        every payload. Raises `EventDecodeError` for the first row that does not decode.
        """
        count = len(payloads)
        if len(types) != count or len(versions) != count:
            raise ValueError("decode_many takes a type, a version and a payload for each row")
        if not count:
            return []
        try:
            items = load_payloads(payloads)
            decoders: Iterable[Callable[[Any], Event] | None]
            if tuple(map(self._versions.get, types)) == tuple(versions):  # all current
                decoders = map(self._current.__getitem__, types)
            else:
                decoders = map(self._fast.get, zip(types, versions, strict=True))
            return list(map(call, decoders, items))  # type: ignore[arg-type]  # None: a miss
        except Exception:
            # A row the fast path refuses (or a payload that is not exactly one CBOR item):
            # each row alone, which raises for the first that does not decode.
            return list(map(self.decode, types, versions, payloads))

    def _decode_checked(self, event_type: str, schema_version: int, payload: bytes) -> Event:
        layout = self._layouts.get(event_type)
        if layout is None:
            raise EventDecodeError(event_type, schema_version, "unknown event type")
        try:
            data = one_item(payload)
        except ValueError as exc:
            raise EventDecodeError(event_type, schema_version, f"payload {exc}") from None
        except Exception as exc:  # cbor2 raises several unrelated classes on bad input
            raise EventDecodeError(event_type, schema_version, f"not CBOR: {exc}") from None
        current = layout.cls.schema_version
        if schema_version == current:
            expected, form = (list, "an array") if layout.cls.positional else (dict, "a map")
            if type(data) is not expected:
                raise EventDecodeError(event_type, schema_version, f"payload is not {form}")
        else:
            self._check_version(event_type, schema_version, current)
            if not _is_wire_form(data):
                raise EventDecodeError(
                    event_type, schema_version, "payload is not a map or an array"
                )
            data = self._upcast(event_type, schema_version, current, data)
        try:
            return layout.structure(data)
        except KeyError as exc:
            raise EventDecodeError(event_type, schema_version, f"missing field {exc}") from None
        except Exception as exc:  # a field hook (cattrs) refused a value
            raise EventDecodeError(event_type, schema_version, str(exc) or repr(exc)) from None

    @staticmethod
    def _check_version(event_type: str, version: int, current: int) -> None:
        if version > current:
            raise EventDecodeError(
                event_type, version, f"written by a newer runfold (this one reads up to {current})"
            )
        if version < 1:
            raise EventDecodeError(event_type, version, "schema versions start at 1")

    def _upcast(self, event_type: str, version: int, current: int, data: Any) -> Any:
        while version < current:
            upcaster = self._upcasters.get((event_type, version))
            if upcaster is None:
                raise EventDecodeError(event_type, version, f"no upcaster from version {version}")
            try:
                data = upcaster(data)
            except Exception as exc:  # an old payload the upcaster cannot lift is undecodable
                raise EventDecodeError(
                    event_type, version, f"upcaster from version {version} failed: {exc!r}"
                ) from exc
            if not _is_wire_form(data):
                raise EventDecodeError(
                    event_type,
                    version,
                    f"upcaster from version {version} did not return a map or an array",
                )
            version += 1
        return data


default_codec = EventCodec()
"""The codec `encode_event`, `decode_event` and every runfold store use."""


encode_event = default_codec.encode
"""`(type, schema_version, payload)` of an event, with the default codec: `encode_event(event)`.

Raises `TypeError` for an object that is not a registered event.
"""


decode_event = default_codec.decode
"""Decode a stored event with the default codec: `decode_event(type, schema_version, payload)`.

Raises `EventDecodeError` for bytes that do not decode into that type and version.
"""

decode_events = default_codec.decode_many
"""Decode stored events together with the default codec (`EventCodec.decode_many`).

`decode_events(types, versions, payloads)`: three sequences with an item per row.
"""


_CORRELATION_FIELDS: dict[type[Event], str] = {
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


def correlation_id(event: Event) -> str | None:
    """The entity id an event belongs to, or None for run-level events.

    That is the step, wait, hook, attribute write, progress or child id; a log line belongs to
    its step.
    """
    name = _CORRELATION_FIELDS.get(type(event))
    return None if name is None else getattr(event, name)
