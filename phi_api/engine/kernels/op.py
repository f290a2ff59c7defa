"""The custom-operator library (``ops.cpp``: phi-api's 4-bit matrix kernel and its attention): built from source by
``phi-api build-kernel`` (``make install`` runs it), found by the engine when it loads a model: in the cache, else
beside the source (:data:`PREBUILT`, where the Docker image's builder stage puts it).

The library is compiled against ONNX Runtime's C and C++ API headers, which the onnxruntime wheel does not ship:
the build takes them from Debian's ``libonnxruntime-dev`` package (one pinned file, checked by its SHA-256), of an
earlier release than the runtime. That is safe: the C API only ever grows, and the library asks the runtime for
the API version its headers declare. Building is the only step that reaches the network; the server never does.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import urllib.request
from pathlib import Path

from phi_api.engine.kernels.native import FLAGS, compiled, compiler_missing, cpu_unsupported, library_file, unsupported
from phi_api.errors import KernelError

SOURCE = Path(__file__).with_name("ops.cpp")
# A library built elsewhere and shipped with the source: the Docker image's runtime stage copies its builder
# stage's here, not into the cache folder, which is a volume and would hide it.
PREBUILT = SOURCE.with_name("prebuilt")
HEADERS_URL = "http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
HEADERS_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
HEADERS_DIR = "ort-headers-1.21.0"
LIBRARY = "libphi_api_q4"
OP_FLAGS = tuple(flag for flag in FLAGS if flag != "-fopenmp")


def library_in(folder: Path) -> Path:
    """The library's file in ``folder`` (whether or not it is built). Its name is keyed by the source, the headers
    and the flags, so a library built from another source is never taken for this one."""
    return library_file(SOURCE, OP_FLAGS, folder, LIBRARY)


def library_path(cache_dir: Path) -> Path:
    """Where the library built from this source with these flags lives in the cache (whether or not it is built)."""
    return library_in(cache_dir / "kernels")


def find_library(cache_dir: Path) -> tuple[Path | None, str]:
    """The built library (the cache's, else the one in :data:`PREBUILT`), or None and why the kernel cannot serve
    here. Only the CPU is checked: a library already built needs no compiler."""
    reason = cpu_unsupported()
    if reason:
        return None, reason
    for path in (library_path(cache_dir), library_in(PREBUILT)):
        if path.is_file():
            return path, ""
    if compiler_missing():
        return None, "its library is not built, and g++, which builds it, is not installed"
    return None, "its library is not built (`make install` or `phi-api build-kernel` builds it)"


def build_library(cache_dir: Path, into: Path | None = None, any_cpu: bool = False) -> Path:
    """Build the library (once: a second call returns the same file) into ``into``, by default the cache's
    ``kernels`` folder: its path, or KernelError saying why not. ``any_cpu`` builds even where this CPU lacks the
    instructions, for the machines that have them (the flags name an instruction set, not this CPU)."""
    reason = compiler_missing() if any_cpu else unsupported()
    if reason:
        raise KernelError(f"phi-api's 4-bit kernel cannot {'be built' if any_cpu else 'run'} here: {reason}")
    folder = into or cache_dir / "kernels"
    path = library_in(folder)
    if path.is_file():
        return path
    include = _headers(cache_dir / "kernels" / HEADERS_DIR)  # downloaded once per cache, wherever libraries go
    return compiled(SOURCE, OP_FLAGS, folder, LIBRARY, include)


def _headers(folder: Path) -> Path:
    """ONNX Runtime's API headers, extracted from the pinned Debian package into ``folder`` (once)."""
    include = folder / "usr" / "include" / "onnxruntime"
    if (include / "onnxruntime_cxx_api.h").is_file():
        return include
    try:
        with urllib.request.urlopen(HEADERS_URL, timeout=60) as answer:
            package = answer.read()
    except OSError as exc:
        raise KernelError(f"could not download ONNX Runtime's headers from {HEADERS_URL}: {exc}") from exc
    if hashlib.sha256(package).hexdigest() != HEADERS_SHA256:
        raise KernelError(f"{HEADERS_URL} is not the file phi-api pins (its SHA-256 differs)")
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(_member(package, "data.tar")), mode="r:*") as data:
        headers = [item for item in data.getmembers()
                   if item.isfile() and item.name.lstrip("./").startswith("usr/include/onnxruntime/")]
        data.extractall(staging, members=headers, filter="data")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return include


def _member(archive: bytes, prefix: str) -> bytes:
    """The first member of a Debian package (an ``ar`` archive) whose name starts with ``prefix``."""
    if not archive.startswith(b"!<arch>\n"):
        raise KernelError("the headers' package is not a Debian package")
    offset = 8
    while offset + 60 <= len(archive):
        name = archive[offset:offset + 16].decode().strip().rstrip("/")
        size = int(archive[offset + 48:offset + 58].decode().strip())
        start = offset + 60
        if name.startswith(prefix):
            return archive[start:start + size]
        offset = start + size + (size % 2)
    raise KernelError(f"the headers' package holds no {prefix}")
