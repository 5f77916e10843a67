"""Command modules of the ``pyrogp`` command line (registered in :data:`inference.cli.COMMANDS`)."""
