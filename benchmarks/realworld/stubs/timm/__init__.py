"""Tiny stand-in for timm (not installed here): importable only."""
