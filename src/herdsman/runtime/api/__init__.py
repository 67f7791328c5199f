"""The HTTP API: the Starlette app, serving it, and a client for the CLI."""
