"""Plugin types by name.

Plugin classes register themselves with ``@register_plugin``; every module of ``slorouter.scheduling.plugins``
is imported on first lookup, so a new plugin module only needs the decorator. A producer registered with
``default_producer=True`` is auto-created by the loader for its data keys when a configured plugin consumes
them and nobody produces them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TypeVar, overload

from slorouter.scheduling.plugin import KIND_CLASSES, DataProducer, Plugin

PluginClass = TypeVar("PluginClass", bound=type[Plugin])

_plugin_types: dict[str, type[Plugin]] = {}
_default_producers: dict[str, str] = {}  # data key -> producer type name
_builtins_loaded = False


class UnknownPluginTypeError(KeyError):
    """No plugin class is registered under a type name."""

    def __init__(self, type_name: str, known: list[str]) -> None:
        super().__init__(type_name)
        self.type_name = type_name
        self.known = known

    def __str__(self) -> str:
        return f"unknown plugin type {self.type_name!r} (known types: {', '.join(self.known)})"


@overload
def register_plugin(cls: PluginClass, /) -> PluginClass: ...
@overload
def register_plugin(
    *, default_producer: bool | tuple[str, ...] = False
) -> Callable[[PluginClass], PluginClass]: ...


def register_plugin(
    cls: PluginClass | None = None, /, *, default_producer: bool | tuple[str, ...] = False
) -> PluginClass | Callable[[PluginClass], PluginClass]:
    """Class decorator: register a plugin class under its ``type_name``.

    ``@register_plugin(default_producer=True)`` also makes a DataProducer the default producer of every key
    in its ``produces``; a tuple of keys, of those keys only (a producer that also writes another
    producer's keys).
    """

    def register(plugin_cls: PluginClass) -> PluginClass:
        _add(plugin_cls, default_producer)
        return plugin_cls

    return register if cls is None else register(cls)


def _add(cls: type[Plugin], default_producer: bool | tuple[str, ...]) -> None:
    name = cls.type_name
    if not name:
        raise ValueError(f"{cls.__qualname__} has no type_name")
    existing = _plugin_types.get(name)
    if existing is not None and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"plugin type {name!r} is already registered by {existing.__qualname__}")
    if not kinds_of_class(cls):
        raise ValueError(f"{cls.__qualname__} implements no plugin kind")
    _plugin_types[name] = cls
    if default_producer:
        if not issubclass(cls, DataProducer) or not cls.produces:
            raise ValueError(f"{cls.__qualname__} is a default producer but produces no data key")
        keys = default_producer if isinstance(default_producer, tuple) else cls.produces
        unknown = set(keys) - set(cls.produces)
        if unknown:
            raise ValueError(
                f"{cls.__qualname__} is the default producer of keys it does not produce: {unknown}"
            )
        for key in keys:
            _default_producers[key] = name


def kinds_of_class(cls: type) -> list[str]:
    """The kind names a plugin class implements."""
    return [kind for kind, base in KIND_CLASSES.items() if issubclass(cls, base)]


def load_builtin_plugins() -> None:
    """Import every module of ``slorouter.scheduling.plugins`` and of its packages so their plugins register
    themselves."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    package = importlib.import_module("slorouter.scheduling.plugins")
    for module in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
        importlib.import_module(module.name)
    _builtins_loaded = True


def plugin_class(type_name: str) -> type[Plugin]:
    """The class registered under ``type_name``; ``UnknownPluginTypeError`` lists the known types."""
    load_builtin_plugins()
    cls = _plugin_types.get(type_name)
    if cls is None:
        raise UnknownPluginTypeError(type_name, registered_types())
    return cls


def registered_types() -> list[str]:
    load_builtin_plugins()
    return sorted(_plugin_types)


def default_producer_type(data_key: str) -> str | None:
    """Type name of the producer auto-created for ``data_key``, if one is registered."""
    load_builtin_plugins()
    return _default_producers.get(data_key)
