"""The adaptive keep-alive: each model's idle-gap histogram and the pure policy that plans its
unload, pre-warm and keep-alive from it (issue 34)."""
