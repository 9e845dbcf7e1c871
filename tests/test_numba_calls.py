"""Calling a compiled function by its address (app/models/numba_calls.py): the callee gets its
arguments, converted to its declared types, and its exceptions reach the caller, in a `prange`
loop too; an argument of another type is refused when the caller compiles; the caller's code
holds the call, not the callee's code; and a caller read from Numba's cache in a new process
calls the callee where that process has it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit, prange, types  # noqa: E402

from numba.core.errors import TypingError  # noqa: E402

from app.models.numba_calls import address_of, caller  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@njit
def _scaled_add(a, out, k, fail):
    if fail:
        raise ValueError("the callee refused")
    for i in range(a.shape[0]):
        out[i] += a[i] * k * np.float32(1234.5)


SIGNATURE = (types.float32[::1], types.float32[::1], types.float32, types.boolean)
call_at = caller(lambda given: SIGNATURE)


@njit
def _rows_one_by_one(at, a, out):
    for p in range(out.shape[0]):
        call_at(at, a, out[p], np.float32(p), False)  # a literal False passed as a boolean


@njit(parallel=True)
def _rows_in_parallel(at, a, out):
    for p in prange(out.shape[0]):
        call_at(at, a, out[p], np.float32(p), False)


@njit
def _failing(at, a, out):
    call_at(at, a, out, np.float32(1), True)


@njit
def _converted(at, a, out, k):
    call_at(at, a, out, k, 1)  # an integer where a float32 and a boolean are declared


@njit
def _wrong_array(at, a, out):
    call_at(at, a.astype(np.float64), out, np.float32(1), False)


def _expected(a: np.ndarray, rows: int) -> np.ndarray:
    return np.stack([a * np.float32(p) * np.float32(1234.5) for p in range(rows)])


def test_the_callee_gets_each_argument_in_a_loop_and_in_a_prange():
    at = address_of(_scaled_add, SIGNATURE)
    assert at == address_of(_scaled_add, SIGNATURE)  # compiled once
    a = np.arange(1, 9, dtype=np.float32)
    for run in (_rows_one_by_one, _rows_in_parallel):
        out = np.zeros((5, 8), np.float32)
        run(at, a, out)
        np.testing.assert_array_equal(out, _expected(a, 5))


def test_arguments_are_converted_to_the_declared_types_or_refused():
    at = address_of(_scaled_add, SIGNATURE)
    a, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="the callee refused"):  # 1 arrived as True
        _converted(at, a, out, 3)
    with pytest.raises(TypingError, match=r"argument 0 of a call by address is array\(float64"):
        _wrong_array(at, a, out)
    assert not out.any()


def test_an_exception_in_the_callee_reaches_the_caller():
    at = address_of(_scaled_add, SIGNATURE)
    out = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="the callee refused"):
        _failing(at, np.ones(8, np.float32), out)
    assert not out.any()


def test_the_callers_code_holds_the_call_not_the_callees_code():
    """What saves the kernels' compile time: the callee's body is not linked into the caller."""
    at = address_of(_scaled_add, SIGNATURE)
    _rows_one_by_one(at, np.ones(8, np.float32), np.zeros((2, 8), np.float32))
    caller = _rows_one_by_one.inspect_llvm(_rows_one_by_one.signatures[0])
    name = _scaled_add.overloads[SIGNATURE].fndesc.llvm_func_name
    assert f"@{name}(" in _scaled_add.inspect_llvm(SIGNATURE)  # (defined in its own module)
    assert name not in caller and "inttoptr" in caller


CACHED = '''
import json
import numpy as np
from numba import njit, types
from app.models.numba_calls import address_of, caller

SIGNATURE = (types.float32[::1], types.float32[::1], types.float32)
call_at = caller(lambda given: SIGNATURE)

@njit(cache=True)
def callee(a, out, k):
    for i in range(a.shape[0]):
        out[i] += a[i] * k

@njit(cache=True)
def caller(at, a, out):
    for p in range(out.shape[0]):
        call_at(at, a, out[p], np.float32(p + 1))

at = address_of(callee, SIGNATURE)
out = np.zeros((3, 4), np.float32)
caller(at, np.arange(4, dtype=np.float32), out)
print(json.dumps({"out": out.tolist(), "hits": sum(caller.stats.cache_hits.values())}))
'''


def test_a_cached_caller_calls_the_callee_where_a_new_process_has_it(tmp_path):
    (tmp_path / "probe.py").write_text(CACHED)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    runs = []
    for _ in range(2):  # (each process maps the callee's code where it will)
        done = subprocess.run([sys.executable, str(tmp_path / "probe.py")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    expected = [[float(v * p) for v in range(4)] for p in (1, 2, 3)]
    assert [run["out"] for run in runs] == [expected, expected]
    assert [run["hits"] for run in runs] == [0, 1]  # the second process read the caller from the cache
