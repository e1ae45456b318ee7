"""Modules that load on first use, so that a command pays only for what it touches."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any


def lazy_import(name: str) -> ModuleType:
    """``name``, imported when one of its attributes is first read (``importlib.util.LazyLoader``).

    An already imported module is returned as it is. A submodule whose package is not
    imported yet (``pyarrow.parquet``) is a stand-in that imports it on first use:
    finding a submodule's spec would import its package now.
    """
    if name in sys.modules:
        return sys.modules[name]
    parent = name.rpartition(".")[0]
    if parent and (parent not in sys.modules or _pending(sys.modules[parent])):
        return _Deferred(name)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def _pending(module: ModuleType) -> bool:
    """Whether ``module`` is a ``LazyLoader`` module not loaded yet (``type`` reads no
    attribute of it, so it stays so)."""
    return type(module).__name__ == "_LazyModule"


class _Deferred(ModuleType):
    """A stand-in for a module: the first attribute read imports it; from then on its
    names are read from this object's own namespace (a copy), others from the module."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # (copy, pickle and the like probe these)
            raise AttributeError(attr)
        module = importlib.import_module(self.__name__)
        self.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
        return getattr(module, attr)
