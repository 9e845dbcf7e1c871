"""Calling a compiled Numba function by its address, so that a caller's compile does not take in
the callee's code.

Numba links the LLVM code of every function a compiled function calls into the caller's module
and runs LLVM's whole optimisation and code generation on it again there: a callee's cost is paid
once per caller, and once more per `prange` loop (each loop is a function of its own). The
products' code (kernels_numba.part_product, its register tiles inlined) is most of what the CPU
kernels compile, and `matmul` and each of `decoder_body`'s loops took it in again: on this
repository's 2-core AMD EPYC the tiles took 7 s to build, and each function that took them in
4-15 s more (the build without AVX2: 18 s, then 15-55 s each). docs/gguf.md has the cold
compile's times before and after.

Called through its address instead, the callee is compiled (or read from the kernel cache) once,
on its own, for one declared signature, and a caller holds only the call. The address is an
argument, never a constant in the caller's code, so the caller's cached code stays valid in the
next process, where the callee is at another address. A caller's arguments are converted to the
declared types where Numba converts them (an index, a constant, a C array where any layout is
declared), and refused at the caller's compile otherwise: the code at the address never reads
an argument as a type it was not compiled for.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba.core import cgutils, errors, types
from numba.core.callconv import excinfo_t
from numba.extending import intrinsic


def address_of(dispatcher, signature: tuple) -> int:
    """Where `dispatcher`'s code for exactly these argument types starts (compiled, or read from
    its cache, first): what a `caller(...)` calls."""
    dispatcher.compile(signature)
    compiled = dispatcher.overloads[tuple(signature)]
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)


def caller(declared: Callable[[tuple], tuple]):
    """An intrinsic `call(address, *arguments)` for functions returning nothing: `declared` maps
    the types of a call's arguments to the signature the function at `address` was compiled for
    (`address_of(function, that signature)`), the same for every call of that kind. Numba's own
    calling convention: arrays as its array structs, and a status that carries an exception
    raised in the callee to the caller."""

    @intrinsic
    def call(typingctx, address, *arguments):
        given = tuple(arguments[0] if len(arguments) == 1 and isinstance(arguments[0], types.StarArgTuple)
                      else arguments)
        wanted = tuple(declared(given))
        if not isinstance(address, types.Integer) or len(wanted) != len(given):
            raise errors.TypingError(f"a call by address takes an integer address and {len(wanted)} arguments")
        for at, (kind, into) in enumerate(zip(given, wanted, strict=True)):
            if kind != into and typingctx.can_convert(kind, into) is None:
                raise errors.TypingError(f"argument {at} of a call by address is {kind}, declared {into}")

        def codegen(context, builder, sig, args):
            convention = context.call_conv
            values = [context.cast(builder, value, kind, into) for value, kind, into
                      in zip(cgutils.unpack_tuple(builder, args[1], len(given)), given, wanted, strict=True)]
            callee = builder.inttoptr(args[0], convention.get_function_type(types.void, wanted).as_pointer())
            kind = convention.get_return_type(types.void).pointee
            returned = cgutils.alloca_once(builder, kind)
            builder.store(cgutils.get_null_value(kind), returned)
            raised = cgutils.alloca_once(builder, ir.PointerType(excinfo_t), name="excinfo")
            packed = list(convention._get_arg_packer(wanted).as_arguments(builder, values))
            code = builder.call(callee, [returned, raised, *packed])
            status = convention._get_return_status(builder, code, builder.load(raised))
            with cgutils.if_unlikely(builder, status.is_error):  # as Numba's own calls: the caller raises it
                convention.return_status_propagate(builder, status)
            return context.get_dummy_value()

        return types.void(address, types.StarArgTuple(given)), codegen

    return call
