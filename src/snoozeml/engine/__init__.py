"""Models, their lifecycle and leases, batching, replicas, memory and events; service.py is all a
transport may call. Imports no transport."""
