"""Typed configuration helpers shared by the library's dataclass configs."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from replaylab.contracts.errors import InputError

T = TypeVar("T")


class ConfigError(InputError, ValueError):
    """A configuration value that cannot be used; the message names the field and the value."""


def fail_field(cls: str, name: str, value: object, why: str) -> None:
    """Raise the ValueError every config dataclass raises: `Cls.field=value: why`."""
    raise ValueError(f"{cls}.{name}={value!r}: {why}")


def _tuple_fields(cls: type) -> set[str]:
    """Names of `cls`'s fields annotated as tuples (YAML gives lists; the configs are frozen)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that does not resolve: read its text
        hints = {f.name: f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    out = set()
    for name, hint in hints.items():
        kinds = [hint, *typing.get_args(hint)] if typing.get_origin(hint) is not tuple else [hint]
        if any(typing.get_origin(k) is tuple or k is tuple
               or (isinstance(k, str) and k.startswith("tuple")) for k in kinds):
            out.add(name)
    return out


def dataclass_of(hint: Any) -> type | None:
    """The dataclass a config field holds (`X` or `X | None`), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
        return args[0]
    return None


def from_mapping(cls: type[T], values: dict[str, Any] | None, where: str) -> T:
    """Build dataclass `cls` from a plain mapping: the one converter from config to dataclass.

    Unknown keys are a ConfigError naming them; a list given for a tuple-typed field
    becomes a tuple. Values are checked by the dataclass's own `__post_init__`; the
    entry points' ConfigStore schemas (`replaylab.apps.schemas`) check YAML keys at
    composition.
    """
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(names))}")
    for name in _tuple_fields(cls) & set(values):
        v = values[name]
        if isinstance(v, Sequence) and not isinstance(v, str | bytes):
            values[name] = tuple(v)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e
