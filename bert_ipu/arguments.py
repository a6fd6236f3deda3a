"""The command lines' argument parser: argparse's, whose errors are one line (`prog: error: ...; see --help`),
as every other refusal of this project is, instead of its usage block followed by the error.

    p = Parser(description=__doc__)   # any argparse.ArgumentParser arguments
"""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line on stderr and exit code 2 (argparse's own code for a bad command line)."""
        print(f"{self.prog}: error: {message}; see --help", file=sys.stderr)
        sys.exit(2)
