# phi-api: the server only (no conversion tools). Mount an ONNX Runtime GenAI
# model folder at /models/model, or point MODEL_PATH elsewhere.
#   docker build -t phi-api .
#   docker run -p 8000:8000 -v /path/to/cpu-int4-awq-block-128-acc-level-4:/models/model:ro \
#     -v phi-api-cache:/var/cache/phi-api phi-api
FROM python:3.11-slim

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

COPY phi_api/ phi_api/
COPY schemas/ schemas/
COPY wsgi.py gunicorn.conf.py ./

# The host's prepacked copy of the model (made at first start), prompts on disk and the Batch API's files and
# batches live here: mount a volume to keep them.
# A pull (MODEL=...) downloads into the Hugging Face cache, HF_HOME, on the same volume; the user has a home.
RUN useradd --system --create-home --home-dir /home/phi-api phi-api \
    && mkdir -p /var/cache/phi-api && chown phi-api /var/cache/phi-api
USER phi-api
EXPOSE 8000
VOLUME ["/var/cache/phi-api"]
# Ready when a worker answers /health (the slim image has no curl: Python asks).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; url = 'http://127.0.0.1:%s/health' % os.environ.get('SERVER_PORT', '8000'); sys.exit(urllib.request.urlopen(url, timeout=4).status != 200)"]
CMD ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
