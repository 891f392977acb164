"""One inference request in the engine: its transport-neutral form, its checks against the
model's metadata, and what is made of its outputs after the run (the classification extension)."""
