"""Rare-event detection in video capsule endoscopy: the library behind the DVC stages."""

__version__ = "0.1.0"
