"""ONNX models through onnxruntime: the backend, its sessions, the weights cache, text encoders."""
