"""``phi-api build-kernel``: build phi-api's 4-bit operator library (``make install`` runs it).

Where the kernel cannot run (no AVX-512 VNNI, no g++, the headers out of reach, a failed build) it says why in
one line and exits 0: the server then computes 4-bit weights with ONNX Runtime's kernel (INT4_KERNEL=auto).
``--strict`` exits 1 instead.

``--any-cpu --into DIR`` builds for other machines (the Docker image's builder stage,
``deploy/docker/build-kernel.sh``): without checking this CPU's instructions, into DIR instead of the cache (the
image copies it to ``phi_api/engine/kernels/prebuilt/``, where the engine looks after the cache).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from phi_api.errors import KernelError


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true", help="exit 1 when the kernel cannot be built here")
    parser.add_argument("--any-cpu", action="store_true",
                        help="build even where this CPU lacks AVX-512 VNNI, for machines that have it (g++ is still "
                             "needed)")
    parser.add_argument("--into", type=Path, metavar="DIR",
                        help="write the library into DIR instead of phi-api's cache (the headers stay in the cache)")


def main(args: argparse.Namespace) -> int:
    from phi_api.engine.kernels.op import build_library
    from phi_api.settings import cache_root

    try:
        path = build_library(cache_root() / "runtime", into=args.into, any_cpu=args.any_cpu)
    except KernelError as exc:
        print(f"{exc}; 4-bit weights will use ONNX Runtime's kernel (MLAS)")
        return 1 if args.strict else 0
    print(path)
    return 0
