"""The one argparse parser class every `fleetpulse` parser is built with.

`build_parser` makes the top-level parser a `FleetPulseParser`; argparse's `add_subparsers`
uses the parent's class for its children, so every subcommand (and sub-subcommand) parser gets
the same rules without each command module asking for them:

- no abbreviations: `--hour 1` is an error, not a silent `--hours 1` (an abbreviation that
  works today breaks the day a second option starting the same way is added);
- defaults are shown in `--help` (only real ones: not None/False/empty, and not where the help text
  already says what the default is); a command's hand-formatted description or epilog
  (RawDescriptionHelpFormatter) keeps its layout;
- an unknown option is reported by the parser of the command it was given to, with that
  command's usage (argparse would hand it up to the top level, which prints the top-level
  usage: no help for someone who misspelt an option of `sql`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def _help_with_default(action: argparse.Action, text: str) -> str:
    """`text` plus "(default: …)" when the default is worth saying and not said already."""
    default = action.default
    if (
        "default" in text.lower()
        or default in (None, False, argparse.SUPPRESS)
        or default in ([], (), "")
        or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
    ):
        return text
    return f"{text} (default: %(default)s)"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions like the default formatter; appends real defaults to option help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return _help_with_default(action, action.help or "")


class RawDescriptionDefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps a hand-formatted description/epilog as written; appends real defaults."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return _help_with_default(action, action.help or "")


class FleetPulseParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        formatter = kwargs.get("formatter_class", argparse.HelpFormatter)
        if formatter is argparse.RawDescriptionHelpFormatter:
            kwargs["formatter_class"] = RawDescriptionDefaultsHelpFormatter
        elif formatter is argparse.HelpFormatter:
            kwargs["formatter_class"] = DefaultsHelpFormatter
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A subcommand's parser is called through parse_known_args and returns what it did not
        # recognise to its parent; erroring here instead names the right command. Nothing
        # after a subcommand's name can belong to its parent (argparse gives the subcommand
        # every remaining argument), so no valid command line is refused.
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


class DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option: works, and says which spelling to use instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, use: str,
                 **kwargs: Any) -> None:
        self.use = use
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.use}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)
