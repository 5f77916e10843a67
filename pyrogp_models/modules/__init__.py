"""The module, the library's currency: its record, its files, stacks of modules and routing."""
