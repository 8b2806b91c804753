"""The `plan` command line: one module per verb (commands/<verb>.py), errors as one line on stderr."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from llmplan.core.errors import InputError

# Each name is a module commands/<name>.py exposing register(subparsers); the order is --help's.
COMMANDS = ["info", "make_model", "compile", "tune", "run", "eval", "serve", "inspect", "tokenize", "detokenize",
            "chat_template", "ir", "passes", "env"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only the one named `only`: each command's module imports what it
    needs, so registering one keeps `plan info` from importing the engine and the compiler."""
    parser = _Parser(prog="plan", description="llmplan: ahead-of-time compiler for LLM inference")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in [only] if only else COMMANDS:
        importlib.import_module(f"llmplan.commands.{name}").register(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The command argv names (its module's name), if its first word after --debug is one."""
    words = [a for a in argv if a != "--debug"]
    name = words[0].replace("-", "_") if words else ""
    return name if name in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command(argv)).parse_args(argv)
    try:
        return args.run(args) or 0
    except BrokenPipeError:  # output piped into something like `head` that stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (InputError, OSError) as e:
        if args.debug:
            raise
        msg = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename and e.strerror else str(e)
        print(f"plan: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
