"""Graph formats on top of the segmenter: FusionGraph to and from JSON (serialize.py, with
symbolic sizes in symbolic_json.py) and nvFuser's Python-frontend scripts read as data (nvfuser/)."""
