"""The name ``fuseg`` that torch's logging finds: ``TORCH_LOGS=+fuseg`` (or ``fuseg``).

torch reads ``TORCH_LOGS`` when it is imported, before any backend is loaded, and accepts there
only the names it registered itself or importable module names; this module is what makes
``fuseg`` such a name, so that torch sets the ``fuseg`` logger's level and handlers. The loggers
that write under it live in ``runtime/logs.py`` (Note [fuseg in torch's logs]).
"""
