"""Rare-event detection in video capsule endoscopy: the library behind the DVC stages."""

__version__ = "0.2.0"  # as in pyproject.toml
