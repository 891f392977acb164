"""Who is calling, and may they: API keys and JWTs checked against the role each operation needs."""
