"""Dynamic micro-batching: the pure policy, the per-replica loop, and the hand-off to the worker."""
