"""models.toml as typed settings: the tables, their cross-field checks, `SNOOZE_*` overrides, and
problems named by key and line."""
