"""The request boundary and the codecs, transport by transport (http/, grpc/), with metrics/ and
openapi/. Calls the engine only through its service."""
