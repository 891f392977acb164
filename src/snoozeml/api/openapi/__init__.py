"""The OpenAPI document of the HTTP API, served at `GET /openapi.json`."""
