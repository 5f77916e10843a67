"""Exceptions raised by pyrogp_models; each message is one user-facing line naming the problem."""


class PyrogpError(Exception):
    """Base class of every error this library raises on purpose."""


class DataError(PyrogpError, ValueError):
    """Bad input data: missing file, unknown column, NaN/inf, bad labels, empty partition."""


class ModuleFileError(PyrogpError):
    """A module file is missing, corrupted, tampered with or invalid; the message names the file."""


class IncompatibleModulesError(PyrogpError):
    """Modules that cannot be combined (different kernels, input dimensions, likelihoods, ...)."""


class CholeskyError(PyrogpError):
    """A Cholesky factorisation failed even after adding the largest jitter."""
