"""Placeholder package; see DESIGN.md for what lands here."""
