"""Errors caused by what the user handed us. The CLI reports these as one line and exits 2."""


from llmplan.core.errors import InputError


class GGUFError(InputError):
    """A GGUF file failed validation. `field` names what was wrong, `offset` where it was read."""

    def __init__(self, path: str, field: str, problem: str, offset: int | None = None):
        self.path, self.field, self.problem, self.offset = path, field, problem, offset
        where = f" (at byte {offset})" if offset is not None else ""
        super().__init__(f"{path}: {field}: {problem}{where}")


class GGUFEndianError(GGUFError):
    """The file is a big-endian GGUF; only little-endian files are supported."""


class ConfigError(InputError):
    """Model metadata or the tensor table does not describe a model we can run."""


class TokenizerError(InputError):
    """A vocabulary we cannot tokenize with, or text or token ids it cannot take."""


class ChatTemplateError(TokenizerError):
    """A chat template that does not parse, escapes the sandbox, or exceeds its time or size bound."""
