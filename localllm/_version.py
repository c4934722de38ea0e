"""The package version, in a leaf module anything may import."""

from __future__ import annotations

__version__ = "0.1.0"
