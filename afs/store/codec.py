"""Typed results to JSON and back (pure).

The models in `afs.models` are frozen dataclasses of plain values, tuples,
mappings and other dataclasses. `encode` turns one into JSON-ready data;
`decode(TaskResult, data)` rebuilds it from the type hints, so a stored task
gives back the very `TaskResult` its report was rendered from.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin

T = TypeVar("T")


def encode(value: Any) -> Any:
    """A dataclass (or anything inside one) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # dates, decimals: text, as the report shows them


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(cls: type[T], data: Any) -> T:
    """Rebuild a `cls` dataclass from `encode`'s output; raises ValueError on a mismatch."""
    result: T = _decode(cls, data, cls.__name__)
    return result


def _key(hint: Any, key: str, where: str) -> Any:
    """A mapping's key as its type says (JSON keys are text: `encode` wrote int keys as text)."""
    if hint is int:
        try:
            return int(key)
        except ValueError:
            raise ValueError(f"{where}: key {key!r} is not an integer") from None
    return key


def _decode(hint: Any, data: Any, where: str) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return data
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, data, where)
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        raise ValueError(f"{where}: {data!r} fits none of {hint}: {'; '.join(errors)}")
    if origin is typing.Literal:
        if data not in get_args(hint):
            raise ValueError(f"{where}: {data!r} is not one of {get_args(hint)}")
        return data
    if origin is tuple:
        args = get_args(hint)
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin in (Mapping, dict, typing.Mapping) or hint in (dict, Mapping):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        args = get_args(hint)
        value_hint = args[1] if args else Any
        return {_key(args[0] if args else Any, k, where): _decode(value_hint, v, f"{where}.{k}")
                for k, v in data.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        hints = _hints(hint)
        values = {}
        for f in dataclasses.fields(hint):
            if f.name in data:
                values[f.name] = _decode(hints[f.name], data[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}: missing {f.name}")
        return hint(**values)
    if hint is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"{where}: expected a number, got {data!r}")
        return float(data)
    if hint in (int, str, bool):
        if not isinstance(data, hint) or (hint is int and isinstance(data, bool)):
            raise ValueError(f"{where}: expected {hint.__name__}, got {data!r}")
        return data
    if isinstance(hint, str):  # an alias that stayed a string
        raise ValueError(f"{where}: unresolved type {hint!r}")
    return data
