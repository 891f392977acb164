"""The `snooze` command line: one module a subcommand."""
