"""``python -m optpipe_lightning.cli``: the same as ``optpipe``."""

from .app import main

main()
