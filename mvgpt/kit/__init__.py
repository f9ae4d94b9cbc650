"""The plumbing under every script: one-line errors and checked flags, atomic files, the run-folder guard."""
