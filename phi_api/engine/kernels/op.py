"""The custom-operator library (``ops.cpp``: phi-api's 4-bit matrix kernel and its attention): built from source by
``phi-api build-kernel`` (``make install`` runs it), found by the engine when it loads a model.

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

from phi_api.engine.kernels.native import FLAGS, compiled, library_file, unsupported
from phi_api.errors import KernelError

SOURCE = Path(__file__).with_name("ops.cpp")
HEADERS_URL = "http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
HEADERS_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
HEADERS_DIR = "ort-headers-1.21.0"
LIBRARY = "libphi_api_q4"
OP_FLAGS = tuple(flag for flag in FLAGS if flag != "-fopenmp")


def library_path(cache_dir: Path) -> Path:
    """Where the library built from this source with these flags lives (whether or not it is built)."""
    return library_file(SOURCE, OP_FLAGS, cache_dir / "kernels", LIBRARY)


def find_library(cache_dir: Path) -> tuple[Path | None, str]:
    """The built library, or None and why the kernel cannot serve here."""
    reason = unsupported()
    if reason:
        return None, reason
    path = library_path(cache_dir)
    if not path.is_file():
        return None, "its library is not built (`make install` or `phi-api build-kernel` builds it)"
    return path, ""


def build_library(cache_dir: Path) -> Path:
    """Build the library (once: a second call returns the same file): its path, or KernelError saying why not."""
    reason = unsupported()
    if reason:
        raise KernelError(f"phi-api's 4-bit kernel cannot run here: {reason}")
    path = library_path(cache_dir)
    if path.is_file():
        return path
    include = _headers(cache_dir / "kernels" / HEADERS_DIR)
    return compiled(SOURCE, OP_FLAGS, cache_dir / "kernels", LIBRARY, include)


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
