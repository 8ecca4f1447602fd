"""``python -m optpipe_lightning``: the ``optpipe`` command."""

from optpipe_lightning.cli import main

if __name__ == "__main__":
    main()
