"""Software prefetch for the compiled loop: start loading a cache line before it is needed.

The prefix cache (``cache.py``) touches its hash table and slot records at
random: every evicted or newly cached unit costs a wait on memory. Where the
next address is known one step ahead (the next key of a request, the next
unit of the LRU queue), ``prefetch`` asks the CPU to fetch it meanwhile. It is
a hint: it changes no value and never faults, whatever the index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _prefetch(typingctx: Any, arr: Any, index: Any) -> Any:
    """Prefetch element ``index`` of C-contiguous ``arr``, counted over its flat memory."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        at = context.cast(builder, args[1], sig.args[1], types.intp)
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        address = builder.bitcast(builder.gep(ary.data, [at]), byte)
        builder.call(fn, [address, i32(0), i32(3), i32(1)])  # read, all cache levels, data
        return context.get_dummy_value()

    return types.void(arr, index), codegen


# as the compiled code calls it: an array and a flat element index, nothing back
prefetch = cast(Callable[[Any, int], None], _prefetch)
