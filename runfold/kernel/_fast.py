"""Fast construction of frozen attrs instances on the decode hot path.

attrs' frozen `__init__` sets each field through `object.__setattr__`, about 0.1 µs a field;
decoding builds two frozen objects per stored event (the event and its `Envelope`), so that cost
dominated replay. Here a class gets a constructor that allocates with `object.__new__` and fills
the slots through their member descriptors, which is about twice as fast. It is only offered for
classes whose fields have no converter and no validator, so nothing `__init__` would do is
skipped; the decoders check every field's type themselves before building.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Any, TypeVar

import attrs

__all__ = ["compile_decoder", "frozen_factory"]

T = TypeVar("T")
_PRIMITIVES = (str, bytes, int, bool)


def _plain_fields(cls: Any) -> tuple[attrs.Attribute[Any], ...]:
    fields: tuple[attrs.Attribute[Any], ...] = attrs.fields(cls)
    for field in fields:
        if field.converter is not None or field.validator is not None:
            raise TypeError(f"{cls.__name__}.{field.name} has a converter or validator")
    return fields


def frozen_factory(cls: type[T]) -> Callable[..., T]:
    """A positional constructor for `cls` (fields in declaration order) that skips `__init__`.

    Defaults are not applied: pass every field.
    """
    fields = _plain_fields(cls)
    setters = [getattr(cls, f.name).__set__ for f in fields]  # slot member descriptors
    args = ", ".join(f"v{i}" for i in range(len(fields)))
    body = "\n".join(f"    s{i}(o, v{i})" for i in range(len(fields)))
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    namespace.update({f"s{i}": setter for i, setter in enumerate(setters)})
    source = f"def make({args}):\n    o = new(cls)\n{body}\n    return o\n"
    exec(compile(source, f"<runfold frozen_factory {cls.__name__}>", "exec"), namespace)
    return namespace["make"]  # type: ignore[no-any-return]


def _split_optional(kind: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if isinstance(kind, UnionType) or typing.get_origin(kind) is typing.Union:
        members = [m for m in typing.get_args(kind) if m is not NoneType]
        optional = len(members) < len(typing.get_args(kind))
        inner = members[0] if len(members) == 1 else typing.Union[tuple(members)]  # noqa: UP007
        return inner, optional
    return kind, False


def compile_decoder(
    cls: type[T],
    structure_hook: Callable[[Any], Callable[[Any, Any], Any]],
    post: dict[str, Callable[[Any], Any]] | None = None,
) -> Callable[[dict[str, Any]], T]:
    """A function turning the unstructured dict of `cls` back into an instance.

    Primitive fields (str, bytes, int, bool, optionally None) are type-checked inline; other
    fields go through `structure_hook(type)` (cattrs). `post` maps a field name to a function
    applied after structuring (for fields whose class has a converter, e.g. a frozen mapping).
    Missing fields take their default; a missing field without one, or a value of the wrong
    type, raises `TypeError`/`KeyError` naming the field.
    """
    post = post or {}
    hints = typing.get_type_hints(cls)
    fields: tuple[attrs.Attribute[Any], ...] = attrs.fields(cls)  # type: ignore[arg-type]
    for field in fields:
        if field.validator is not None or (field.converter is not None and field.name not in post):
            raise TypeError(f"{cls.__name__}.{field.name} has a converter or validator")
    setters = {f.name: getattr(cls, f.name).__set__ for f in fields}
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls, "MISSING": attrs.NOTHING}
    lines = ["def decode(o):", "    r = new(cls)"]
    for f in fields:
        name = f.name
        kind, optional = _split_optional(hints[name])
        namespace[f"set_{name}"] = setters[name]
        if f.default is attrs.NOTHING:
            lines.append(f"    v = o[{name!r}]")
        else:
            if isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
                raise TypeError(f"{cls.__name__}.{name}: factory defaults are not supported")
            namespace[f"default_{name}"] = f.default
            lines.append(f"    v = o.get({name!r}, default_{name})")
        none_ok = "v is not None and " if optional or f.default is None else ""
        if kind in _PRIMITIVES:
            namespace[f"kind_{name}"] = kind
            lines.append(f"    if {none_ok}type(v) is not kind_{name}:")
            message = f"{name}: expected {kind.__name__}, found "
            lines.append(f"        raise TypeError({message!r} + type(v).__name__)")
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
    exec(compile("\n".join(lines) + "\n", f"<runfold decoder {cls.__name__}>", "exec"), namespace)
    return namespace["decode"]  # type: ignore[no-any-return]
