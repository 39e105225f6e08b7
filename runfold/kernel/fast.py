"""Fast construction of frozen attrs instances on the decode hot path, and reading without them.

attrs' frozen `__init__` sets each field through `object.__setattr__`, about 0.1 µs a field;
decoding builds two frozen objects per stored event (the event and its `Envelope`), so that cost
dominated replay. Here a class gets a constructor that allocates with `object.__new__` and fills
the slots through their member descriptors, which is about twice as fast. It is only offered for
classes whose fields have no converter and no validator, so nothing `__init__` would do is
skipped; the decoders check every field's type themselves before building.

A replay need not build the events at all: `compile_unpacker` reads a positional payload's
fields straight into a call (the fold's handler), with the decoder's checks, and
`compile_event_call` makes the same call from a built event, so one handler serves both.
"""

from __future__ import annotations

import inspect
import typing
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from itertools import repeat
from types import NoneType, UnionType
from typing import Any, TypeVar

import attrs

__all__ = [
    "compile_decoder",
    "compile_event_call",
    "compile_unpacker",
    "fast_init",
    "fast_inits",
    "filling_twin",
    "frozen_columns",
    "frozen_factory",
    "frozen_reader",
]

T = TypeVar("T")
_PRIMITIVES = (str, bytes, int, bool)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _plain_fields(cls: Any) -> tuple[attrs.Attribute[Any], ...]:
    fields: tuple[attrs.Attribute[Any], ...] = attrs.fields(cls)
    for field in fields:
        if field.converter is not None or field.validator is not None:
            raise TypeError(f"{cls.__name__}.{field.name} has a converter or validator")
    return fields


_SET_CLASS = object.__dict__["__class__"].__set__
"""Sets an instance's class past a frozen class's `__setattr__` (`object`'s own descriptor)."""
_SWAP_FROM = 3
"""Fields from which `fast_init` fills an instance through its twin (`filling_twin`): below,
the two class swaps cost more than the descriptor calls they save."""


def filling_twin(cls: type[T]) -> type[T] | None:
    """A subclass of the frozen slotted `cls` whose instances take plain attribute stores.

    It adds no slot and restores `object`'s `__setattr__` and `__delattr__`, so storing a field
    is the interpreter's own slot store, where calling a slot's member descriptor costs a
    method call and an argument tuple each. A constructor makes the twin, stores every field and
    sets the instance's class to `cls` (the layouts are one: CPython allows it), which costs about
    what two descriptor calls do. None when `cls` has no slots of its own (no layout to share).
    """
    if "__slots__" not in cls.__dict__:
        return None
    namespace = {
        "__slots__": (),
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        "__doc__": f"`{cls.__name__}` being filled (`runfold.kernel.fast.filling_twin`).",
        "__module__": cls.__module__,
    }
    metaclass: Any = type(cls)
    twin: type[T] = metaclass(f"{cls.__name__}Filling", (cls,), namespace)
    probe = object.__new__(twin)
    try:
        probe.__class__ = cls
    except TypeError:
        return None
    return twin


def frozen_factory(cls: type[T]) -> Callable[..., T]:
    """A positional constructor for `cls` (fields in declaration order) that skips `__init__`.

    Defaults are not applied: pass every field. The instance is filled as its twin
    (`filling_twin`), by plain stores, then made a `cls`.
    """
    fields = _plain_fields(cls)
    args = ", ".join(f"v{i}" for i in range(len(fields)))
    twin = filling_twin(cls)
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls, "twin": twin}
    if twin is not None:
        body = "\n".join(f"    o.{f.name} = v{i}" for i, f in enumerate(fields))
        ending = "    o.__class__ = cls\n    return o\n"
        source = f"def make({args}):\n    o = new(twin)\n{body}\n{ending}"
    else:
        setters = [getattr(cls, f.name).__set__ for f in fields]  # slot member descriptors
        namespace.update({f"s{i}": setter for i, setter in enumerate(setters)})
        body = "\n".join(f"    s{i}(o, v{i})" for i in range(len(fields)))
        source = f"def make({args}):\n    o = new(cls)\n{body}\n    return o\n"
    exec(compile(source, f"<runfold frozen_factory {cls.__name__}>", "exec"), namespace)
    return namespace["make"]  # type: ignore[no-any-return]


def frozen_reader(cls: type[T], sources: dict[str, str]) -> Callable[[Any], T]:
    """A constructor of `cls` that reads each field off one object: `make(source)`.

    Field `name` is `source.<sources.get(name, name)>`. Like `frozen_factory` it skips
    `__init__`, and fills the instance as its twin; with no call of as many arguments as there
    are fields in between, each field costs one read and one store.
    """
    fields = _plain_fields(cls)
    twin = filling_twin(cls)
    if twin is None:
        raise TypeError(f"{cls.__name__} has no slots of its own")
    body = "\n".join(f"    o.{f.name} = b.{sources.get(f.name, f.name)}" for f in fields)
    source = f"def make(b):\n    o = new(twin)\n{body}\n    o.__class__ = cls\n    return o\n"
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls, "twin": twin}
    exec(compile(source, f"<runfold frozen_reader {cls.__name__}>", "exec"), namespace)
    return namespace["make"]  # type: ignore[no-any-return]


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen attrs class `cls` an `__init__` that fills its slots directly.

    The new `__init__` has attrs' own signature (keyword-only when the class is, the same
    defaults) and does what attrs' does for a class without converters, validators, factory
    defaults or `__attrs_post_init__`, which `cls` must be (else `TypeError`); it only skips
    the frozen `__setattr__` attrs' goes through. Type checkers still see attrs' signature.
    Kernel objects are made several times per decision (commands, events, decisions,
    index rows), so their construction is on every step's path.
    """
    fields = _plain_fields(cls)
    if hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__} has __attrs_post_init__")
    twin = filling_twin(cls) if len(fields) >= _SWAP_FROM else None
    namespace: dict[str, Any] = {"cls": cls, "twin": twin, "set_class": _SET_CLASS}
    params, body, stores = [], [], []
    for number, field in enumerate(fields):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            raise TypeError(f"{cls.__name__}.{field.name}: factory defaults are not supported")
        namespace[f"s{number}"] = getattr(cls, field.name).__set__  # the slot's descriptor
        if field.default is attrs.NOTHING:
            params.append(field.name)
        else:
            namespace[f"d{number}"] = field.default
            params.append(f"{field.name}=d{number}")
        body.append(f"    s{number}(self, {field.name})")
        stores.append(f"        self.{field.name} = {field.name}")
    if twin is not None:  # a subclass's instance keeps its class: the descriptors fill it
        body = [
            "    if type(self) is cls:",
            "        set_class(self, twin)",
            *stores,
            "        self.__class__ = cls",
            "    else:",
            *(f"    {line}" for line in body),
        ]
    keyword_only = all(field.kw_only for field in fields)
    signature = ("*, " if keyword_only and params else "") + ", ".join(params)
    source = f"def __init__(self, {signature}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(compile(source, f"<runfold fast_init {cls.__name__}>", "exec"), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def fast_inits(classes: Iterable[type[Any]]) -> None:
    """`fast_init` each of `classes` that it can take; the others keep attrs' `__init__`.

    It cannot take a class with a converter, a validator, a factory default or a post-init hook.
    """
    for cls in classes:
        try:
            fast_init(cls)
        except TypeError:
            continue


def frozen_columns(cls: type[T]) -> Callable[..., list[T]]:
    """A constructor of many instances of `cls` at once, one column per field.

    `make(count, *columns)` takes one iterable per field in declaration order, each holding at
    least `count` values. Like `frozen_factory` it skips `__init__`; it fills one field of every
    instance at a time through `map`, so no Python frame runs per instance (a quarter faster than
    `frozen_factory` for a class of five fields).
    """
    fields = _plain_fields(cls)
    setters = [getattr(cls, f.name).__set__ for f in fields]
    new = object.__new__
    consume: Callable[[Iterable[Any]], None] = deque(maxlen=0).extend

    def make(count: int, *columns: Iterable[Any]) -> list[T]:
        if len(columns) != len(setters):
            raise TypeError(f"{cls.__name__} takes {len(setters)} columns, not {len(columns)}")
        made = list(map(new, repeat(cls, count)))
        for setter, column in zip(setters, columns, strict=True):
            consume(map(setter, made, column))
        if made:  # a short column left the last instance without its field
            for field in fields:
                if not hasattr(made[-1], field.name):
                    raise ValueError(f"{cls.__name__}: fewer than {count} values of {field.name}")
        return made

    return make


def _split_optional(kind: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if isinstance(kind, UnionType) or typing.get_origin(kind) is typing.Union:
        members = [m for m in typing.get_args(kind) if m is not NoneType]
        optional = len(members) < len(typing.get_args(kind))
        inner = members[0] if len(members) == 1 else typing.Union[tuple(members)]  # noqa: UP007
        return inner, optional
    return kind, False


def _checked_fields(cls: Any, post: dict[str, Any]) -> tuple[attrs.Attribute[Any], ...]:
    fields: tuple[attrs.Attribute[Any], ...] = attrs.fields(cls)
    for field in fields:
        if field.validator is not None or (field.converter is not None and field.name not in post):
            raise TypeError(f"{cls.__name__}.{field.name} has a converter or validator")
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            raise TypeError(f"{cls.__name__}.{field.name}: factory defaults are not supported")
    return fields


def _minimum_length(fields: tuple[attrs.Attribute[Any], ...]) -> int:
    """How many leading fields a positional payload must hold: up to the last required one."""
    required = [n for n, f in enumerate(fields) if f.default is attrs.NOTHING]
    return required[-1] + 1 if required else 0


def compile_decoder(
    cls: type[T],
    structure_hook: Callable[[Any], Callable[[Any, Any], Any]],
    post: dict[str, Callable[[Any], Any]] | None = None,
    *,
    wire_defaults: dict[str, Any] | None = None,
    positional: bool = False,
) -> Callable[[Any], T]:
    """A function turning the unstructured form of `cls` back into an instance.

    The form is a dict keyed by field name or, with `positional`, a list of the fields in
    declaration order whose trailing fields may be left out when they hold their defaults.
    Primitive fields (str, bytes, int, bool, optionally None) and times (integer microseconds
    since the epoch) are type-checked inline; other fields go through `structure_hook(type)`
    (cattrs). `post` maps a field name to a function applied after structuring (for fields
    whose class has a converter, e.g. a frozen mapping). A missing field takes its default in
    unstructured form from `wire_defaults` (by default the field's own default), and is then
    structured like a present one; a missing field without one, a list of the wrong length or
    a value of the wrong type raises `TypeError`/`KeyError` naming what was wrong.
    """
    post = post or {}
    wire_defaults = wire_defaults or {}
    hints = typing.get_type_hints(cls)
    fields = _checked_fields(cls, post)
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls, "EPOCH": _EPOCH}
    namespace["delta"] = timedelta
    lines = ["def decode(o):"]
    if positional:
        lowest, count = _minimum_length(fields), len(fields)
        names = [f"v{n}" for n in range(count)]
        lines += [
            "    if type(o) is not list:",
            "        raise TypeError('payload is not an array')",
            "    n = len(o)",
        ]
        # One branch per length the array may have, longest (the usual) first; the fields
        # left out take their defaults.
        for length in range(count, lowest - 1, -1):
            lines.append(f"    {'if' if length == count else 'elif'} n == {length}:")
            if length:
                lines.append(f"        {', '.join(names[:length])}, = o")
            for n in range(length, count):
                namespace[f"default_{n}"] = wire_defaults.get(fields[n].name, fields[n].default)
                lines.append(f"        v{n} = default_{n}")
            if not count:
                lines.append("        pass")
        lines.append("    else:")
        message = f"expected {lowest} to {count} fields, found "
        lines.append(f"        raise TypeError({message!r} + str(n))")
    lines.append("    r = new(cls)")
    for index, f in enumerate(fields):
        name = f.name
        kind, optional = _split_optional(hints[name])
        namespace[f"set_{name}"] = getattr(cls, name).__set__  # the slot's member descriptor
        if positional:
            lines.append(f"    v = v{index}")
        elif f.default is attrs.NOTHING:
            lines.append(f"    v = o[{name!r}]")
        else:
            namespace[f"default_{name}"] = wire_defaults.get(name, f.default)
            lines.append(f"    v = o.get({name!r}, default_{name})")
        none_ok = "v is not None and " if optional or f.default is None else ""
        if kind in _PRIMITIVES or kind is datetime:
            wire = int if kind is datetime else kind  # a time travels as integer microseconds
            namespace[f"kind_{name}"] = wire
            lines.append(f"    if {none_ok}type(v) is not kind_{name}:")
            message = f"{name}: expected {wire.__name__}, found "
            lines.append(f"        raise TypeError({message!r} + type(v).__name__)")
            if kind is datetime:
                indent = "        " if none_ok else "    "
                if none_ok:
                    lines.append("    if v is not None:")
                lines.append(f"{indent}try:")
                lines.append(f"{indent}    v = EPOCH + delta(0, 0, v)")
                lines.append(f"{indent}except OverflowError:")
                message = f"{name}: time out of range"
                lines.append(f"{indent}    raise TypeError({message!r}) from None")
        else:
            namespace[f"hook_{name}"] = structure_hook(kind)
            namespace[f"type_{name}"] = kind
            guard = f"if {none_ok[:-5]}:" if none_ok else "if True:"
            lines.append(f"    {guard}")
            lines.append("        try:")
            lines.append(f"            v = hook_{name}(v, type_{name})")
            lines.append("        except Exception as e:")  # name the field in the reason
            prefix = f"{name}: "
            lines.append(f"            raise TypeError({prefix!r} + (str(e) or repr(e))) from None")
        if name in post:
            namespace[f"post_{name}"] = post[name]
            lines.append(f"    v = post_{name}(v)")
        lines.append(f"    set_{name}(r, v)")
    lines.append("    return r")
    source = "\n".join(lines) + "\n"
    label = f"<runfold {'positional ' if positional else ''}decoder {cls.__name__}>"
    exec(compile(source, label, "exec"), namespace)
    return namespace["decode"]  # type: ignore[no-any-return]


def _named_fields(cls: Any, call: Callable[..., Any]) -> list[str]:
    """The names of `call`'s parameters after the first two (state, time): fields of `cls`."""
    names = list(inspect.signature(call).parameters)[2:]
    fields = {f.name for f in attrs.fields(cls)}
    unknown = [name for name in names if name not in fields]
    if unknown:
        raise TypeError(f"{call.__name__} takes {unknown}, not fields of {cls.__name__}")
    return names


def compile_event_call(cls: type[T], call: Callable[..., Any]) -> Callable[[Any, T, Any], Any]:
    """`handle(state, event, at)` for an instance of `cls`: `call(state, at, *fields)`.

    `call`'s parameters after the first two are named after fields of `cls`; each gets the
    event's value of that field.
    """
    arguments = "".join(f", event.{name}" for name in _named_fields(cls, call))
    source = f"def handle(state, event, at):\n    return call(state, at{arguments})\n"
    namespace: dict[str, Any] = {"call": call}
    exec(compile(source, f"<runfold event call {cls.__name__}>", "exec"), namespace)
    return namespace["handle"]  # type: ignore[no-any-return]


def _literal_strings(kind: Any) -> frozenset[str] | None:
    """The values of a `Literal` of strings, or None for any other type."""
    values = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
    if values and all(type(value) is str for value in values):
        return frozenset(values)
    return None


def compile_unpacker(
    cls: type[T], call: Callable[..., Any], fallback: Callable[[Any, Any, Any], Any]
) -> Callable[[Any, Any, Any], Any]:
    """`unpack(state, payload, at)`: `call` with the fields of `cls`'s positional payload.

    It calls `call(state, at, *fields)` straight from the payload, without building an instance
    of `cls`, or `fallback(state, payload, at)` when the payload is not one it reads. `call`
    names the fields it takes after its first two parameters (as `compile_event_call`). The
    payload is read only when it is what `compile_decoder(cls, …, positional=True)` turns
    into an instance with the same field values: a list of a length the class allows, every
    field of `str`, `bytes`, `int`, `bool`, a time (integer microseconds) or a `Literal` of
    strings holding a value of its type, None where the field allows it, and a field of any
    other type holding None; anything else goes to `fallback`, which should structure the
    payload and raise where the decoder does. A time out of range raises `OverflowError`.
    """
    fields = _plain_fields(cls)
    hints = typing.get_type_hints(cls)
    named = _named_fields(cls, call)
    lowest, count = _minimum_length(fields), len(fields)
    namespace: dict[str, Any] = {"call": call, "fallback": fallback}
    namespace.update(EPOCH=_EPOCH, delta=timedelta)
    lines = ["def unpack(state, o, at):", "    if type(o) is list:", "        n = len(o)"]
    for length in range(count, lowest - 1, -1):
        lines.append(f"        {'if' if length == count else 'elif'} n == {length}:")
        if length:
            lines.append(f"            {''.join(f'v{n}, ' for n in range(length))}= o")
        for n in range(length, count):
            default = fields[n].default
            if default is not None and type(default) not in _PRIMITIVES:
                raise TypeError(f"{cls.__name__}.{fields[n].name}: a default it cannot unpack")
            namespace[f"default_{n}"] = default
            lines.append(f"            v{n} = default_{n}")
        if not count:
            lines.append("            pass")
    lines += ["        else:", "            return fallback(state, o, at)"]
    checks: list[str] = []
    times: list[tuple[int, bool]] = []
    for n, field in enumerate(fields):
        kind, optional = _split_optional(hints[field.name])
        none_ok = f"v{n} is None or " if optional or field.default is None else ""
        literal = _literal_strings(kind)
        if kind in _PRIMITIVES or kind is datetime:
            namespace[f"kind_{n}"] = int if kind is datetime else kind
            checks.append(f"({none_ok}type(v{n}) is kind_{n})")
            if kind is datetime:
                times.append((n, bool(none_ok)))
        elif literal is not None:
            namespace[f"values_{n}"] = literal
            checks.append(f"({none_ok}type(v{n}) is str and v{n} in values_{n})")
        elif none_ok:
            checks.append(f"v{n} is None")
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: a field it cannot unpack")
    lines.append(f"        if {' and '.join(checks) or 'True'}:")
    for n, none_ok_time in times:  # used or not: one out of range fails as it does decoding
        guard = f"None if v{n} is None else " if none_ok_time else ""
        lines.append(f"            v{n} = {guard}EPOCH + delta(0, 0, v{n})")
    index = {field.name: n for n, field in enumerate(fields)}
    arguments = "".join(f", v{index[name]}" for name in named)
    lines.append(f"            return call(state, at{arguments})")
    lines.append("    return fallback(state, o, at)")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<runfold unpacker {cls.__name__}>", "exec"), namespace)
    return namespace["unpack"]  # type: ignore[no-any-return]
