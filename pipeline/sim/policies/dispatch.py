"""The loop's calls into the policies: one compiled dispatch per hook, built from the registry.

numba compiles no table of functions, so each hook (``policies/base.py``) is a
chain of compiled links, one per registered policy that defines it: a link
compares the replica's policy code (``cfg[C_POLICY]``) with its policy's
``code`` and calls that policy's kernel, or hands on to the next link; the
chain ends in the hook's default (for ``schedule``, which every policy
defines, in the last policy's own kernel). The links are inlined into the
loop, so a call costs a few integer compares, as the if-chain it replaces did.

The loop reads these functions as attributes of this module (``dispatch.schedule``):
numba resolves them when it compiles the loop, so ``rebuild`` (after
``policies.register``) must run before the first replay of the process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from numba import njit

from pipeline.sim.cache import PrefixCaches
from pipeline.sim.policies import base
from pipeline.sim.state import C_POLICY, State

HOOKS = ("schedule", "ready_at", "on_decode_run", "on_finished", "attention")


def _own(module: ModuleType, hook: str) -> Any:
    """The module's own kernel for ``hook`` (not one it imported), or None."""
    fn = module.__dict__.get(hook)
    py = getattr(fn, "py_func", None)
    return fn if py is not None and py.__module__ == module.__name__ else None


# One link maker per hook: numba calls no closure with *args.


def _schedule_link(code: int, impl: Any, rest: Any) -> Any:
    @njit(error_model="numpy", inline="always")
    def link(s: State, kc: PrefixCaches, r: int, now: float) -> tuple[int, int, int]:
        if s.cfg[C_POLICY] == code:
            return impl(s, kc, r, now)
        return rest(s, kc, r, now)

    return link


def _ready_at_link(code: int, impl: Any, rest: Any) -> Any:
    @njit(error_model="numpy", inline="always")
    def link(s: State, r: int, clock: float) -> float:
        if s.cfg[C_POLICY] == code:
            return impl(s, r, clock)
        return rest(s, r, clock)

    return link


def _steps_link(code: int, impl: Any, rest: Any) -> Any:
    @njit(error_model="numpy", inline="always")
    def link(s: State, r: int, steps: int) -> None:
        if s.cfg[C_POLICY] == code:
            impl(s, r, steps)
        else:
            rest(s, r, steps)

    return link


def _finished_link(code: int, impl: Any, rest: Any) -> Any:
    @njit(error_model="numpy", inline="always")
    def link(s: State, r: int, done: int, done_decoding: int) -> None:
        if s.cfg[C_POLICY] == code:
            impl(s, r, done, done_decoding)
        else:
            rest(s, r, done, done_decoding)

    return link


def _attention_link(code: int, impl: Any, rest: Any) -> Any:
    # the policy code is not an argument of this hook: the loop passes it first
    @njit(error_model="numpy", inline="always")
    def link(policy: int, p_tok: float, d: float, kv_all: float, ctx: float, pairs: float) -> float:
        if policy == code:
            return impl(p_tok, d, kv_all, ctx, pairs)
        return rest(policy, p_tok, d, kv_all, ctx, pairs)

    return link


@njit(error_model="numpy", inline="always")
def _attention_default(
    policy: int, p_tok: float, d: float, kv_all: float, ctx: float, pairs: float
) -> float:
    return base.attention(p_tok, d, kv_all, ctx, pairs)


_LINKS: dict[str, Callable[[int, Any, Any], Any]] = {
    "schedule": _schedule_link,
    "ready_at": _ready_at_link,
    "on_decode_run": _steps_link,
    "on_finished": _finished_link,
    "attention": _attention_link,
}
_DEFAULTS: dict[str, Any] = {
    "ready_at": base.ready_at,
    "on_decode_run": base.on_decode_run,
    "on_finished": base.on_finished,
    "attention": _attention_default,
}


def chain(modules: Sequence[ModuleType], hook: str) -> Any:
    """The compiled call of ``hook`` over ``modules`` (each with ``POLICY`` and its kernels)."""
    impls = [(m.POLICY.code, _own(m, hook)) for m in modules]
    impls = [(code, fn) for code, fn in impls if fn is not None]
    if hook == "schedule":
        if len(impls) != len(modules):
            missing = [m.__name__ for m in modules if _own(m, "schedule") is None]
            raise TypeError(f"policy module without a schedule kernel: {', '.join(missing)}")
        head, *links = impls[::-1]
        fn = head[1]  # the last policy's own kernel ends the chain
    else:
        links = impls[::-1]
        fn = _DEFAULTS[hook]
    for code, impl in links:
        fn = _LINKS[hook](code, impl, fn)
    return fn


schedule: Any
ready_at: Any
on_decode_run: Any
on_finished: Any
attention: Any


def rebuild() -> None:
    """Build every hook's chain from the registry (``policies.MODULES``)."""
    from pipeline.sim import policies

    for hook in HOOKS:
        globals()[hook] = chain(policies.MODULES, hook)


rebuild()
