"""Every option of every command says what it does in --help, and a command imports only what it needs."""

import argparse
import subprocess
import sys

from llmplan.commands.cli import COMMANDS, build_parser


def _parsers(parser: argparse.ArgumentParser, prog: str = "plan"):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def test_every_option_has_help():
    missing = [f"{prog} {'/'.join(a.option_strings) or a.dest}"
               for prog, p in _parsers(build_parser()) for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and a.help in (None, "")]
    assert not missing, f"options without help text: {missing}"


def test_the_walk_sees_every_command():
    progs = {prog for prog, _ in _parsers(build_parser())}
    assert {f"plan {c.replace('_', '-')}" for c in COMMANDS} <= progs


def test_a_command_imports_only_its_own_module():
    code = ("import sys; from llmplan.commands.cli import main; main(['info', 'missing.gguf']); "
            "print(sorted(m for m in sys.modules if m.startswith(('llmplan.runtime', 'llmplan.plans', "
            "'llmplan.commands.')) and m != 'llmplan.commands.cli'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['llmplan.commands.info']"
