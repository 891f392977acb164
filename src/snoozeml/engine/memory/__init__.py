"""Memory: per-device budgets, admission before a load, victims under pressure, and the probes."""
