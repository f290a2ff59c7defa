"""``phi-api bench roofline``: this machine's own limits, measured in the run that uses them: the int8 dot-product
peak (AVX-512 VNNI, every thread) and the read bandwidth (a buffer far larger than the caches, summed by every
thread). Other benchmarks state their figures as shares of these (:func:`measure`).

Machines differ a lot; a share of the limit measured on the same machine, in the same run, is what compares.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from phi_api.bench.common import say
from phi_api.engine.kernels.native import FLAGS, compiled, unsupported
from phi_api.settings import cache_root

SOURCE = Path(__file__).with_name("roofline.cpp")
BUFFER_BYTES = 2 << 30  # 2 GiB: far past any cache


@dataclass(frozen=True)
class Limits:
    """The machine's limits: multiply-adds of int8 a second (GMAC/s) and bytes read a second (GB/s), medians."""

    threads: int
    int8_gmacs: float
    read_gbs: float
    int8_gmacs_runs: tuple[float, ...] = ()
    read_gbs_runs: tuple[float, ...] = ()


def _library() -> ctypes.CDLL:
    reason = unsupported()
    if reason:
        raise RuntimeError(f"the roofline needs AVX-512 VNNI and g++: {reason}")
    library = ctypes.CDLL(str(compiled(SOURCE, FLAGS, cache_root() / "runtime" / "kernels", "roofline")))
    library.roofline_int8_macs.restype = ctypes.c_double
    library.roofline_int8_macs.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    library.roofline_read.restype = ctypes.c_double
    library.roofline_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    return library


def measure(threads: int | None = None, runs: int = 5) -> Limits:
    """The limits of ``threads`` threads (default: every core), medians of ``runs`` runs."""
    threads = threads or os.cpu_count() or 1
    library = _library()
    checksum = ctypes.c_int64()
    library.roofline_int8_macs(threads, 1 << 20, ctypes.byref(checksum))  # the cores up to speed
    macs = [library.roofline_int8_macs(threads, 1 << 24, ctypes.byref(checksum)) / 1e9 for _ in range(runs)]
    buffer = mmap.mmap(-1, BUFFER_BYTES)
    try:
        view = (ctypes.c_uint8 * BUFFER_BYTES).from_buffer(buffer)
        ctypes.memset(view, 1, BUFFER_BYTES)  # every page made real first
        address = ctypes.addressof(view)
        library.roofline_read(address, BUFFER_BYTES, threads, ctypes.byref(checksum))
        reads = [library.roofline_read(address, BUFFER_BYTES, threads, ctypes.byref(checksum)) / 1e9
                 for _ in range(runs)]
        del view
    finally:
        buffer.close()
    return Limits(threads, statistics.median(macs), statistics.median(reads), tuple(macs), tuple(reads))


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="threads (default: every core)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each measure (medians are reported)")


def main(args: argparse.Namespace) -> int:
    say("the int8 dot-product peak, then the read bandwidth")
    limits = measure(args.threads, args.runs)
    print(json.dumps(asdict(limits), indent=2))
    return 0
