#!/bin/sh
# Builds phi-api's kernel library into OUTPUT_DIR: the Docker image's builder stage runs it (tests/test_deploy.py
# runs it too, in an empty environment). The image may serve on any x86-64 machine, so the library is built for
# the instruction set the kernel needs (--any-cpu), not for the builder's CPU; the engine checks the serving CPU
# and keeps ONNX Runtime's kernel where it lacks them. --strict: a failed build fails the image's build, instead
# of an image that quietly serves without the kernel.
#   deploy/docker/build-kernel.sh OUTPUT_DIR   (run from the checkout's root, or the image's /app)
set -eu

if [ "$#" -ne 1 ]; then
    echo "usage: $0 OUTPUT_DIR" >&2
    exit 2
fi
output=$1

python -m phi_api build-kernel --strict --any-cpu --into "$output"

# Exactly one library: the runtime stage copies the whole folder beside the kernel's source.
count=$(find "$output" -maxdepth 1 -name 'libphi_api_q4-*.so' | wc -l | tr -d ' ')
if [ "$count" -ne 1 ]; then
    echo "build-kernel.sh: expected one libphi_api_q4-*.so in $output, found $count" >&2
    exit 1
fi
