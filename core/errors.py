"""Errors caused by what the user handed us. The CLI reports these as one line and exits 2."""


class InputError(ValueError):
    """Base of every error about bad input (files, metadata, arguments, plans), as opposed to a bug."""


class FormatError(InputError):
    """A tensor format we cannot decode, or data whose size does not fit its format."""
