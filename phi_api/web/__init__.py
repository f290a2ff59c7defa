"""The web layer's own parts: app resources, request bodies and SSE, error responses, schemas, OpenAPI, auth."""
