"""The loop's calls into the policies: one compiled dispatch per hook, built from the registry.

numba compiles no table of functions, so each hook (``policies/base.py``) is a
chain of compares, one per registered policy that defines it: each
compares the replica's policy code (``cfg[C_POLICY]``) with its policy's
``code`` and calls that policy's kernel, or goes on to the next; the chain
ends in the hook's default (for ``schedule``, which every policy defines, in
the last policy's own kernel). The chain is one function, written from the
registry (``_source``) and inlined into the loop, so a call costs a few
integer compares, as the if-chain it replaces did.

The loop reads these functions as attributes of this module (``dispatch.schedule``):
numba resolves them when it compiles the loop, so ``rebuild`` (after
``policies.register``) must run before the first replay of the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from numba import njit

from pipeline.sim.policies import base
from pipeline.sim.state import C_POLICY

HOOKS = ("schedule", "ready_at", "on_decode_run", "on_finished", "attention")
# bits of cfg[C_HOOKS]: the loop calls these hooks only for a policy that defines them (a
# call binds the state record, a reference per field, so a default that does nothing is
# not called at all)
HOOK_READY_AT = 1
HOOK_DECODE_RUN = 2
HOOK_FINISHED = 4
_BITS = {"ready_at": HOOK_READY_AT, "on_decode_run": HOOK_DECODE_RUN, "on_finished": HOOK_FINISHED}


def hooks_of(module: ModuleType) -> int:
    """The ``cfg[C_HOOKS]`` bits of the optional hooks ``module`` defines."""
    return sum(bit for hook, bit in _BITS.items() if _own(module, hook) is not None)


def _own(module: ModuleType, hook: str) -> Any:
    """The module's own kernel for ``hook`` (not one it imported), or None."""
    fn = module.__dict__.get(hook)
    py = getattr(fn, "py_func", None)
    return fn if py is not None and py.__module__ == module.__name__ else None


# The signature of each hook's kernels: the dispatch is written with the same parameters.
_PARAMS = {
    "schedule": "s, kc, r, now",
    "ready_at": "s, r, clock",
    "on_decode_run": "s, r, steps",
    "on_finished": "s, r, done, done_decoding",
    "attention": "policy, p_tok, d, kv_all, ctx, pairs",  # the code comes first: no s here
}
_DEFAULTS: dict[str, Any] = {
    "ready_at": base.ready_at,
    "on_decode_run": base.on_decode_run,
    "on_finished": base.on_finished,
    "attention": base.attention,
}


def _source(hook: str, codes: Sequence[int], has_default: bool) -> str:
    """One flat if-chain over the codes: each link of a chain of functions would bind the
    state record once more (a reference-count call per array), so the chain is one body."""
    params = _PARAMS[hook]
    code = "policy" if hook == "attention" else "s.cfg[C_POLICY]"
    args = params.split(", ", 1)[1] if hook == "attention" else params
    lines = [f"def {hook}({params}):", f"    code = {code}"]
    last = len(codes) - (0 if has_default else 1)
    for j, c in enumerate(codes[:last]):
        lines += [f"    if code == {c}:", f"        return impl{j}({args})"]
    lines.append(
        f"    return impl{last}({args})" if not has_default else f"    return default({args})"
    )
    return "\n".join(lines) + "\n"


def chain(modules: Sequence[ModuleType], hook: str) -> Any:
    """The compiled call of ``hook`` over ``modules`` (each with ``POLICY`` and its kernels)."""
    impls = [(m.POLICY.code, _own(m, hook)) for m in modules]
    impls = [(code, fn) for code, fn in impls if fn is not None]
    if hook == "schedule" and len(impls) != len(modules):
        missing = [m.__name__ for m in modules if _own(m, "schedule") is None]
        raise TypeError(f"policy module without a schedule kernel: {', '.join(missing)}")
    has_default = hook != "schedule"  # every policy has a schedule: the last one ends it
    namespace: dict[str, Any] = {"C_POLICY": C_POLICY, "default": _DEFAULTS.get(hook)}
    namespace.update({f"impl{j}": fn for j, (_, fn) in enumerate(impls)})
    exec(_source(hook, [c for c, _ in impls], has_default), namespace)  # noqa: S102
    return njit(error_model="numpy", inline="always")(namespace[hook])


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
