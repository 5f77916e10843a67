"""Files: one registry of the formats the library writes (:mod:`.formats`) — each with its load,
save, predictor, description and summary — and modules as read from a file or folder
(:mod:`.module_sets`)."""

from pyrogp_models.io.formats import (
    FORMATS,
    FileFormat,
    describe,
    format_of,
    load,
    load_modules,
    load_predictor,
    save,
    summarise,
)
from pyrogp_models.io.module_sets import MAX_ROWS, ModuleSet, describe_rule, module_table

__all__ = ["FORMATS", "MAX_ROWS", "FileFormat", "ModuleSet", "describe", "describe_rule",
           "format_of", "load", "load_modules", "load_predictor", "module_table", "save",
           "summarise"]
