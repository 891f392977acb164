"""safetensors models through PyTorch (the optional `torch` extra): Hugging Face folders and
plain state dicts."""
