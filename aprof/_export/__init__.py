"""Exporters: one output format per module."""
