"""Borrowed array views for the compiled loop: the same memory, no reference counting.

numba counts references to every array it hands around: each call that is not
inlined, and each binding of an array to a new name (which is what inlining a
function's arguments amounts to), increments and later decrements the array's
reference count with an atomic instruction (``NRT_incref`` / ``NRT_decref``).
The replay loop passes a dozen arrays per step and some per request, so those
atomics were about half of its time (``bench/loop_profile.py``).

``borrow(a)`` returns a view of ``a`` whose memory-info pointer is null: numba's
reference-count helpers return at once for it (they test the pointer first),
so passing and binding a borrowed view costs a call that does nothing. The view
does not keep the memory alive: it must be used only while the array it was
borrowed from is alive, which holds for the arguments of the compiled function
that borrows them (the caller holds those until the call returns). Never
return a borrowed view or store it anywhere that outlives that call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _borrow(typingctx: Any, arr: Any) -> Any:
    """A view of array ``arr`` without a reference to its memory (see the module doc)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        cls = context.make_array(arr)
        src = cls(context, builder, value=args[0])
        out = cls(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(out, name, getattr(src, name))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()

    return arr(arr), codegen


A = TypeVar("A")
borrow = cast(Callable[[A], A], _borrow)  # as the compiled code calls it: one array in, one out
