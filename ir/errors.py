"""IR errors: a bad graph is a bug in whatever built it; bad IR text is the user's input."""

from llmplan.core.errors import InputError


class IRError(Exception):
    """Base of the IR's own errors."""


class IRTypeError(IRError):
    """Operand types or attributes that an op's schema rejects."""


class VerifyError(IRError):
    """A graph breaks an invariant; the message names the node."""


class ParseError(IRError, InputError):
    """IR text that does not parse; the message names the line."""
