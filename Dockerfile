# phi-api: the server only (no conversion tools). Mount an ONNX Runtime GenAI model folder at /models/model, or
# point MODEL_PATH elsewhere.
#   docker build -t phi-api .
#   docker run -p 8000:8000 -v /path/to/cpu-int4-awq-block-128-acc-level-4:/models/model:ro \
#     -v phi-api-cache:/var/cache/phi-api phi-api
# Three stages: the pinned packages (shared), the kernel's builder (g++, discarded), the image that serves.
FROM python:3.11-slim AS base

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MODEL_PATH=/models/model \
    PHI_API_CACHE_DIR=/var/cache/phi-api \
    HF_HOME=/var/cache/phi-api/huggingface \
    SERVER_HOST=0.0.0.0 \
    SERVER_PORT=8000

WORKDIR /app
# Every package pinned, dependencies of dependencies included (requirements.lock).
COPY requirements.lock .
RUN pip install --no-deps -r requirements.lock

# phi-api's 4-bit kernel, compiled here so that the image that serves needs no compiler. It is built for AVX-512
# VNNI whatever the builder's CPU (the engine checks the serving CPU and keeps ONNX Runtime's kernel where it
# lacks them); the headers come from the pinned Debian package, checked by its SHA-256.
FROM base AS kernel
# g++ is not pinned to a version: it must come from the Debian release of the base image, whose C++ runtime the
# image that serves links the library against, and a pinned version breaks the build when that release moves on.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
COPY phi_api/ phi_api/
COPY deploy/docker/build-kernel.sh deploy/docker/
RUN sh deploy/docker/build-kernel.sh /kernel

FROM base
COPY phi_api/ phi_api/
# Beside the kernel's source (where the engine looks after the cache), not in the cache: that is a volume, which
# would hide it.
COPY --from=kernel /kernel/ phi_api/engine/kernels/prebuilt/
COPY schemas/ schemas/
COPY wsgi.py gunicorn.conf.py ./

# The host's prepacked copy of the model (made at first start), prompts on disk and the Batch API's files and
# batches live here: mount a volume to keep them.
# A pull (MODEL=...) downloads into the Hugging Face cache, HF_HOME, on the same volume; the user has a home.
RUN useradd --system --create-home --home-dir /home/phi-api phi-api \
    && mkdir -p /var/cache/phi-api && chown phi-api /var/cache/phi-api
# The user is made just above, so its name resolves in the image; a fixed number instead would change the owner
# that existing volumes were made for.
# hadolint ignore=DL3066
USER phi-api
EXPOSE 8000
VOLUME ["/var/cache/phi-api"]
# Ready when a worker answers /health (the slim image has no curl: Python asks).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; url = 'http://127.0.0.1:%s/health' % os.environ.get('SERVER_PORT', '8000'); sys.exit(urllib.request.urlopen(url, timeout=4).status != 200)"]
CMD ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
