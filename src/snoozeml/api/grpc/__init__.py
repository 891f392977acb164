"""The gRPC transport: the OIP service, its codec and server, and ModelMesh's model-runtime SPI."""
