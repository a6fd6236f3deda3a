"""The command lines' argument parser: argparse's, whose errors are one line (`prog: error: ...; see --help`),
as every other refusal of this project is, instead of its usage block followed by the error.

    p = Parser(description=__doc__)   # any argparse.ArgumentParser arguments
    p.add_argument("--steps", type=at_least(1), default=10)       # a whole number >= 1, else one line
    p.add_argument("--time-limit", type=positive, default=30.0)   # a finite number > 0
"""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line on stderr and exit code 2 (argparse's own code for a bad command line)."""
        print(f"{self.prog}: error: {message}; see --help", file=sys.stderr)
        sys.exit(2)

    def check_output(self, path, flag: str, ours) -> None:
        """Refuse (`error`), before any work, an output file `files.output_file_problem` finds a problem with (a
        missing folder, a folder, a file this project did not write); nothing where `path` is not given."""
        from .files import output_file_problem

        problem = path and output_file_problem(path, flag, ours)
        if problem:
            self.error(problem)


def at_least(minimum: int, maximum: int | None = None, why: str = ""):
    """An argparse type: an int >= minimum (and <= maximum, when given; `why` says why in the message). A bad value
    is argparse's one-line usage error, exit 2."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is above {maximum:,}{why}")
        return value
    return parse


def positive(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, megabytes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number above 0")
    return value


def device_name(text: str) -> str:
    """An argparse type: a torch device name (cpu, cuda, cuda:1); checked, not created."""
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N)") from None
    return text
