"""The parsers: formats as data (``spec``), the chunk reader (``reader``), the vectorised engine (``engine``) and
request assembly (``assemble``).

A regular package, so that a ``parsers/`` folder in the user's working directory neither merges with it (as it
would with a namespace package) nor runs in its place (``forensics`` loads the one installed beside it).  It
imports nothing, of the project or of ``forensics``: each module is imported by its own name.
"""
