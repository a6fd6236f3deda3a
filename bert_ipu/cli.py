"""The one command line of every task: run_pretraining.py, run_squad.py, run_glue.py, run_causal_lm.py,
run_profiling.py and `python -m bert_ipu` are this parser.

    python -m bert_ipu --config NAME [--resume | --overwrite | --auto-resume] [--eval-only] [--print-config]
        [KEY=VALUE ...]

NAME is a file in configs/ (without .yaml) or a path to a YAML file; KEY=VALUE pairs (anywhere on the line)
override single fields (section.key=value). `--print-config` prints the resolved config (overlays and
overrides applied) as YAML and exits. A kind's own flags (the profile's --algorithms, --json, ...) set fields
of its config. A config of several processes per replica (pipeline stages x tensor-parallel ranks) started
without torchrun launches them on this machine. Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from .arguments import Parser
from .config import ConfigError, to_yaml
from .engine import checkpoint
from .engine.launch import die_with_launcher, launch_if_needed
from .engine.runtime import RunError, finish, report_error
from .tasks import TaskSpec, load_config, registry


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(KEY=VALUE overrides, everything else): overrides may come anywhere, also after --resume or after a flag
    that takes several values (which would otherwise swallow them)."""
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    return overrides, [a for a in argv if a not in overrides]


_OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.\w+)*=")
"""KEY=VALUE: a dotted key before the first "=" (a path holding "=", /tmp/lr=1.jsonl given to --json, is not one)"""


def parser(specs: list[TaskSpec], prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of a command line that runs configs of the kinds `specs` (one for run_X.py, all for -m)."""
    doc = specs[0].doc if len(specs) == 1 else __doc__
    p = Parser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, metavar="NAME", help="config name in configs/ or path to a .yaml file")
    if any(s.resumable for s in specs):
        mode = p.add_mutually_exclusive_group()
        mode.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir "
                          "(on any number of processes)")
        mode.add_argument("--overwrite", action="store_true", help="replace the run already in output_dir")
        mode.add_argument("--auto-resume", action="store_true", help="--resume where output_dir holds a checkpoint, "
                          "else start (over a run of this project that stopped before its first checkpoint): a rerun "
                          "continues or skips what an earlier one did (make wikipedia)")
        if any(s.eval_only is not None for s in specs):  # (with --overwrite: replaces an earlier evaluation)
            p.add_argument("--eval-only", action="store_true", help="no training: evaluate model.init_checkpoint "
                           "on the evaluation data (--overwrite replaces an evaluation, never a training run, "
                           "already in output_dir)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (YAML) and exit")
    seen = set()
    for s in specs:
        for flag, kwargs, _ in s.arguments:
            if flag not in seen:
                seen.add(flag)
                p.add_argument(flag, **kwargs)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=f"override one field, e.g. {_example(specs)}")
    return p


def _example(specs: list[TaskSpec]) -> str:
    """Overrides that the kinds `specs` take (a profile has no train section or output_dir)."""
    return "train.max_steps=50 output_dir=runs/x" if any(s.resumable for s in specs) else "profile.steps=5"


def config(argv: list[str], kind: str | None = None):
    """(the config a command line runs, its parsed flags, its spec)."""
    specs = registry()
    chosen = [specs[kind]] if kind else list(specs.values())
    overrides, rest = _split(argv)
    if kind is None and ("-h" in rest or "--help" in rest):  # the help of the config's own kind, where one is named
        named = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--config"), None)
        named = named or next((a.split("=", 1)[1] for a in rest if a.startswith("--config=")), None)
        try:
            chosen = [specs[load_config(named, overrides).kind]] if named else chosen
        except (ConfigError, KeyError):
            pass  # (a config that does not load: the general help)
    args = parser(chosen, None if kind else "python -m bert_ipu").parse_args(rest)
    if args.overrides:  # what argparse left over: words without "=" (KEY=VALUE pairs were taken out above)
        raise ConfigError(f"argument {args.overrides[0]!r} is not a KEY=VALUE override (e.g. {_example(chosen)}) or "
                          "a flag of this command; see --help")
    if kind is None:  # python -m bert_ipu: the config's own kind decides; its flags must be its kind's
        kind = load_config(args.config, overrides).kind
    spec = specs[kind]
    flags = vars(args)
    if not spec.resumable and (flags.get("resume") or flags.get("overwrite") or flags.get("auto_resume")):
        raise ConfigError(f"--resume, --auto-resume and --overwrite are for runs that write a run folder; a {kind} "
                          "config does not: drop the flag")
    if flags.get("eval_only"):
        if spec.eval_only is None:
            raise ConfigError(f"--eval-only: a {kind} run cannot evaluate only; drop --eval-only")
        if flags.get("resume") or flags.get("auto_resume"):
            raise ConfigError("--resume and --auto-resume continue a training run, and --eval-only trains nothing; "
                              "drop one")
        overrides += list(spec.eval_only)
    own = {flag for flag, _, _ in spec.arguments}
    for flag, _, key in (a for s in chosen for a in s.arguments):
        value = flags[flag.lstrip("-").replace("-", "_")]
        if value is None or value is False:  # not given: the config decides
            continue
        if flag not in own:
            raise ConfigError(f"{flag} is a flag of another kind of config; {args.config} is of kind {kind}")
        overrides.append(f"{key}={json.dumps(value)}")  # JSON is YAML: paths stay strings, lists lists
    return load_config(args.config, overrides, kind), args, spec


def check_inputs(cfg, spec) -> None:
    """What can be checked before any process is launched or file written: the init checkpoint exists, the
    trackers of train.report_to are installed, and the kind's own preflight (its data)."""
    init = getattr(cfg.model, "init_checkpoint", None)  # every kind's model section but the profile's has it
    if init:
        from .tasks.common import require_checkpoint_folder

        require_checkpoint_folder(init)
    report_to = getattr(getattr(cfg, "train", None), "report_to", None)  # the profile has no train section
    if report_to:
        from .engine.trackers import check_installed

        check_installed(report_to)
    if spec.preflight is not None:
        spec.preflight(cfg)


def main(argv: list[str] | None = None, kind: str | None = None, script: str | None = None) -> int:
    """Run the command line `argv` (default sys.argv[1:]) for configs of `kind` (None: any kind); `script` is the
    file that re-runs it in launched processes (the caller's entry point). Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    die_with_launcher()
    try:
        cfg, args, spec = config(argv, kind)
        flags = vars(args)
        if args.print_config:
            print(to_yaml(cfg), end="")
            return 0
        check_inputs(cfg, spec)
        if spec.launches:
            code = launch_if_needed(cfg, script or sys.argv[0], argv, cfg.model.parameter_estimate())
            if code is not None:  # its processes were launched here and have finished
                return code
        overwrite = flags.get("overwrite", False)
        resume = flags.get("resume", False)
        if flags.get("auto_resume", False):  # resume; a run of ours stopped before its first checkpoint: start over
            resume = bool(checkpoint.checkpoints(Path(cfg.output_dir)))
            overwrite = not resume
        result = spec.run(cfg, resume=resume, overwrite=overwrite)
    except (ConfigError, RunError) as e:
        report_error(e)
        return getattr(e, "exit_code", 2)  # a ConfigError has none: 2
    except KeyboardInterrupt:  # before training began (or outside it): nothing of a run to name
        report_error(RunError("stopped by Ctrl-C before training began; nothing was checkpointed"))
        return 130
    line = spec.summary(result)
    if line and int(os.environ.get("RANK", "0")) == 0:  # rank 0 speaks for a run of several processes
        print(line)
    return 0


def run(kind: str | None, script: str) -> None:
    """An entry point's whole body: `run("pretraining", __file__)` runs the command line and ends the process."""
    finish(main(kind=kind, script=script))
