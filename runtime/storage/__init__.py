"""Tensors in their planned layouts (layout.py) and big CPU buffers on huge pages (pages.py)."""
