"""Command modules of the ``pyrogp`` command line (registered in
:data:`pyrogp_models.inference.cli.COMMANDS`)."""
