"""``phi-api build-kernel``: build phi-api's 4-bit operator library (``make install`` runs it).

Where the kernel cannot run (no AVX-512 VNNI, no g++, the headers out of reach, a failed build) it says why in
one line and exits 0: the server then computes 4-bit weights with ONNX Runtime's kernel (INT4_KERNEL=auto).
``--strict`` exits 1 instead.
"""

from __future__ import annotations

import argparse

from phi_api.errors import KernelError


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true", help="exit 1 when the kernel cannot be built here")


def main(args: argparse.Namespace) -> int:
    from phi_api.engine.kernels.op import build_library
    from phi_api.settings import cache_root

    try:
        path = build_library(cache_root() / "runtime")
    except KernelError as exc:
        print(f"{exc}; 4-bit weights will use ONNX Runtime's kernel (MLAS)")
        return 1 if args.strict else 0
    print(path)
    return 0
