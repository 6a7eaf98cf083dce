"""The `sr-blockwise` command: one subcommand per job, one module per subcommand.

A command with a config dataclass (train.TrainConfig, evaluate.EvalConfig, upscale.Config) names
its options' destinations after the config's fields and builds the config from them, so the
two cannot drift apart (tests compare the defaults). Train and evaluate (`config_from`) import
neither torch nor the config's module to build their parser, so `sr-blockwise --help` stays
fast; upscale (`sr_blockwise/cli/upscale.py`) reads its choices from its config module.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import fields

# Each of these modules has `register(subparsers)` adding its subcommands (with set_defaults(func=...)).
SUBCOMMAND_MODULES = [
    "sr_blockwise.cli.prepare",  # prepare
    "sr_blockwise.cli.weights",  # weights
    "sr_blockwise.cli.export",  # export
    "sr_blockwise.cli.distill",  # distill
    "sr_blockwise.cli.bench",  # bench-decode, bench-train
    "sr_blockwise.cli.bench_serve",  # bench-serve
    "sr_blockwise.cli.trees",  # trees
    "sr_blockwise.cli.learning_curve",  # learning-curve
    "sr_blockwise.cli.examples",  # examples
    "sr_blockwise.cli.upscale",  # upscale
    "sr_blockwise.cli.evaluate",  # evaluate
    "sr_blockwise.cli.demo",  # demo
    "sr_blockwise.cli.rate",  # rate build / serve / analyze
    "sr_blockwise.cli.train",  # train
]


class DefaultsHelp(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the help already says it or there is none
    worth saying (None, off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if states_default(text) or not worth_saying(action):
            return text
        return f"{text} (default: {shown_default(action)})"  # build_parser gives every option some help


def states_default(text: str) -> bool:
    """Whether a help text gives the default itself ('(default 2)', 'default: the shipped'), not
    merely uses the word ("0: torch's default")."""
    return re.search(r"\(default\b|\bdefault:|\bby default\b|\bdefault \d", text, re.IGNORECASE) is not None


def worth_saying(action) -> bool:
    """An option whose default tells something: not a flag (store_true and the like say what they
    do), not None, '' or argparse's SUPPRESS."""
    return (bool(action.option_strings) and action.nargs != 0 and action.default not in (None, "")
            and action.default is not False and action.default != argparse.SUPPRESS)


def shown_default(action) -> str:
    d = action.default
    text = " ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)
    return text.replace("%", "%%")  # argparse %-formats help strings


def _every_parser(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _every_parser(child)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("sr-blockwise")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    import importlib
    import importlib.util

    p = argparse.ArgumentParser(prog="sr-blockwise", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(sub)
    for parser in _every_parser(p):  # one rule for every command's --help
        parser.formatter_class = DefaultsHelp
        for action in parser._actions:
            if not action.help and worth_saying(action):  # argparse shows nothing for an option without help
                action.help = f"default: {shown_default(action)}"
    return p


def config_from(config, args: argparse.Namespace, **overrides):
    """A config dataclass from parsed arguments: each field from the option of its name, except
    `overrides` (fields an option does not give as such)."""
    return config(**{f.name: overrides[f.name] if f.name in overrides else getattr(args, f.name)
                     for f in fields(config)})


# packages only some commands need, by the pyproject extra that installs them (the base install
# decodes, upscales and trains without them)
EXTRAS = {"gradio": "demo", "stlpips_pytorch": "eval", "torchsummary": "eval",
          "IPython": "eval"}


def main(argv=None) -> int:
    try:
        rc = run_command(argv)
        sys.stdout.flush()  # here, not at exit: a reader that stopped early is met inside this try
        return rc
    except KeyboardInterrupt:  # e.g. while the commands' modules load, before one handles Ctrl-C itself
        print("\nsr-blockwise: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not stdout_reader_gone():  # another pipe or socket broke: a failure to show
            raise
        # the output went to a reader that stopped early (| head): quiet, as other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit's flush does not fail again
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe stopped


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reading end is closed."""
    import select
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object with no file (a test's capture)
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def run_command(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        # one line: a control character in a path it names (a newline, an escape sequence) escaped
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(e))
        print(f"sr-blockwise {args.command}: error: {text}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"sr-blockwise {args.command}: error: this needs the package {e.name}, which the base install "
              f"leaves out: pip install 'sr-blockwise[{extra}]'", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
