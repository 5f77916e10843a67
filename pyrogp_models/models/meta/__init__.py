"""Meta-GPs fitted to modules: the single-output meta-GP and the multi-output (LMC) meta-GP."""
