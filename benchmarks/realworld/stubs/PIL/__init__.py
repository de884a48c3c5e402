"""Tiny stand-in for Pillow (not installed here): Image.fromarray gives the array back (its save() writes an empty file), open fails; ImageOps, ImageEnhance, ImageDraw are importable only."""
