"""phi-api: an OpenAI-compatible inference server for ONNX Runtime GenAI models on CPU.

Build the app with :func:`phi_api.app.create_app`; the version is :data:`phi_api.version.__version__`.
"""
