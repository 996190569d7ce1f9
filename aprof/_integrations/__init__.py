"""Integrations: asyncio/uvloop and trio task hooks (anyio rides on both)."""
