"""One blueprint per API surface: thin routes that read a request, call the service, and answer."""

from phi_api.api.batches import bp as batches_bp
from phi_api.api.chat import bp as chat_bp
from phi_api.api.completions import bp as completions_bp
from phi_api.api.conversations import bp as conversations_bp
from phi_api.api.embeddings import bp as embeddings_bp
from phi_api.api.infill import bp as infill_bp
from phi_api.api.messages import bp as messages_bp
from phi_api.api.models import bp as models_bp
from phi_api.api.ollama import bp as ollama_bp
from phi_api.api.openarc import bp as openarc_bp
from phi_api.api.operations import bp as operations_bp
from phi_api.api.rerank import bp as rerank_bp
from phi_api.api.responses import bp as responses_bp
from phi_api.api.usage import bp as usage_bp

BLUEPRINTS = (models_bp, chat_bp, completions_bp, responses_bp, messages_bp, ollama_bp, operations_bp, openarc_bp,
              batches_bp, usage_bp, infill_bp, conversations_bp, embeddings_bp,
              rerank_bp)
