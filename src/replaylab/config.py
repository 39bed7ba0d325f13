"""Typed configuration helpers shared by the library's dataclass configs."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the field and the value."""


def fail_field(cls: str, name: str, value: object, why: str) -> None:
    """Raise the ValueError every config dataclass raises: `Cls.field=value: why`."""
    raise ValueError(f"{cls}.{name}={value!r}: {why}")


def from_mapping(cls: type[T], values: dict[str, Any] | None, where: str) -> T:
    """Build dataclass `cls` from a plain mapping; unknown keys are a ConfigError.

    Types are checked by the dataclass's own `__post_init__` where it has one;
    Hydra/OmegaConf structured merging does the YAML-side checking.
    """
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(names))}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e
