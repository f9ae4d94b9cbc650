"""The live view (docs/live.md): what the page shows (views.py) and the page itself (static/)."""
