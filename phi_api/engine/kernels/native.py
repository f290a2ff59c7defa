"""The kernel's shared library: built from ``q4_vnni.cpp`` with g++ (once per source and compiler, in a cache
folder) where the CPU has AVX-512 VNNI, and called through ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

from phi_api.errors import KernelError

SOURCE = Path(__file__).with_name("q4_vnni.cpp")
HEADER = SOURCE.with_name("q4_kernel.h")
FLAGS = ("-O3", "-std=c++17", "-march=x86-64-v4", "-mavx512vnni", "-shared", "-fPIC", "-fopenmp")
NEEDED = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni")  # x86-64-v4 and VNNI


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_unsupported() -> str | None:
    """Why this CPU cannot run the kernel (the instructions it lacks), or None: the check at run time, where a
    library built elsewhere (the Docker image's) needs no compiler."""
    missing = [flag for flag in NEEDED if flag not in cpu_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    return None


def compiler_missing() -> str | None:
    """Why no library can be built here (no g++), or None: the check at build time."""
    if shutil.which("g++") is None:
        return "g++ is not installed"
    return None


def unsupported() -> str | None:
    """Why the kernel can be neither built nor run here (a missing CPU feature or compiler), or None."""
    return cpu_unsupported() or compiler_missing()


def library_file(source: Path, flags: tuple[str, ...], folder: Path, name: str) -> Path:
    """Where :func:`compiled` puts the library of ``source`` and ``flags`` (whether or not it is built)."""
    headers = b"".join(path.read_bytes() for path in sorted(HEADER.parent.glob("*.h")))  # what the sources include
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join(flags).encode()).hexdigest()[:16]
    return folder / f"{name}-{digest}.so"


def compiled(source: Path, flags: tuple[str, ...], folder: Path, name: str, include: Path | None = None) -> Path:
    """The shared library g++ builds from ``source`` (with q4_kernel.h) and ``flags``, in ``folder`` under a name
    keyed by all three: built once, a second call returns the same file. KernelError when g++ fails."""
    library = library_file(source, flags, folder, name)
    if library.is_file():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    partial = library.with_suffix(".partial")
    command = ["g++", *flags, *(["-I", str(include)] if include else []), "-o", str(partial), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise KernelError(f"g++ could not build {source.name}: {built.stderr[-2000:]}")
    partial.rename(library)
    return library


class Q4Kernel:
    """The built library."""

    def __init__(self, cache_dir: Path) -> None:
        reason = unsupported()
        if reason:
            raise KernelError(f"phi-api's 4-bit kernel cannot run: {reason}")
        library = compiled(SOURCE, FLAGS, cache_dir, "q4_vnni")
        self._lib = ctypes.CDLL(str(library))
        self._lib.q4_matmul.restype = ctypes.c_int

    def matmul(self, tiles: np.ndarray, scales: np.ndarray, x: np.ndarray, n: int, threads: int = 1,
               bits: int = 4) -> np.ndarray:
        """``x [M, K]`` (float32) times repacked weights of ``bits`` (:func:`.reference.repack`): ``[M, N]``."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        m, k = x.shape
        y = np.empty((m, n), dtype=np.float32)
        pointer = ctypes.c_void_p
        status = self._lib.q4_matmul(pointer(tiles.ctypes.data), pointer(scales.ctypes.data), pointer(x.ctypes.data),
                                     pointer(y.ctypes.data), m, k, n, bits, threads)
        if status != 0:
            raise KernelError(f"the kernel takes 4 or 8 bits, one row or more, K and N multiples of 16 "
                              f"(not {bits} bits, {m} x {k} x {n})")
        return y

    def bf16_matmul(self, packed: np.ndarray, x: np.ndarray, n: int, threads: int = 1) -> np.ndarray:
        """``x [M, K]`` (float32) times bfloat16 weights in :func:`.reference.pack_bf16`'s layout: ``[M, N]``."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        m, k = x.shape
        y = np.empty((m, n), dtype=np.float32)
        pointer = ctypes.c_void_p
        status = self._lib.bf16_matmul(pointer(packed.ctypes.data), pointer(x.ctypes.data), pointer(y.ctypes.data),
                                       m, k, n, threads)
        if status != 0:
            raise KernelError(f"the BF16 kernel takes one row or more, K and N multiples of 16 (not {m} x {k} x {n})")
        return y
