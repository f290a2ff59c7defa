"""One blueprint per API surface."""

from phi_api.api.chat import bp as chat_bp
from phi_api.api.completions import bp as completions_bp
from phi_api.api.models import bp as models_bp
from phi_api.api.ollama import bp as ollama_bp
from phi_api.api.ops import bp as ops_bp

BLUEPRINTS = (models_bp, chat_bp, completions_bp, ollama_bp, ops_bp)
