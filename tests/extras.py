"""The optional packages some tests need, and how those tests skip without them.

A test of an optional part (the live engines, the HTTP client, real tokenizers, Ray, the
browser check) skips when its package is absent, with a reason that names the extra to
install; an installed package that fails to import is still an error. The conformance
suite (vLLM, SGLang) has its own skips in tests/conformance.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

# import name -> the pyproject extra that installs it
EXTRAS = {
    "torch": "live",
    "transformers": "live",
    "httpx": "live",
    "tokenizers": "test",
    "playwright": "test",
    "ray": "ray",
    "fastapi": "serving",
    "uvicorn": "serving",
}


def reason(module: str) -> str:
    """Why a test skips without ``module``: the extra to install."""
    extra = EXTRAS[module]
    return f"needs {module}, in the '{extra}' extra: pip install -e '.[{extra}]'"


def require(module: str) -> ModuleType:
    """``module``, imported; or skip the test (or, at module level, the file) without it."""
    return pytest.importorskip(module, reason=reason(module))


def needs(*modules: str) -> pytest.MarkDecorator:
    """A mark that skips a test unless all of ``modules`` are installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason="; ".join(reason(m) for m in missing))
