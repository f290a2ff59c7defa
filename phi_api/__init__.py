"""phi-api: an OpenAI-compatible inference server for ONNX Runtime GenAI models on CPU."""

__version__ = "0.1.0"


def create_app(*args, **kwargs):
    """Build the Flask app; see :func:`phi_api.app.create_app`."""
    from phi_api.app import create_app as factory

    return factory(*args, **kwargs)
