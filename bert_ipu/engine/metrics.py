"""What a run reports as it goes: a JSON line per logged step (metrics.jsonl), the numbers of each row to the
trackers of train.report_to (TensorBoard by default, W&B, MLflow: engine/trackers.py), and progress for a
person: a bar on a terminal, a plain log line every `log_every` updates otherwise (batch jobs, cluster logs).
Rank 0 speaks for the run; the other ranks report nothing.

After a resume, rows past the checkpoint's step are dropped from metrics.jsonl first, so no step appears
twice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..files import write_atomic
from .runtime import RunError
from .trackers import Trackers


def _is_terminal() -> bool:
    return sys.stderr.isatty()


class MetricsLogger:
    """`report_to`: the trackers (train.report_to); `config`: the run's resolved config (OUTPUT/config.yaml's), the
    trackers' params; `name`: the run's name there."""

    def __init__(self, out: Path, main: bool, total_steps: int, start_step: int = 0, progress: bool = True,
                 desc: str = "training", report_to=("tensorboard",), config: dict | None = None,
                 name: str = "run"):
        self.main, self.total = main, total_steps
        self.file = self.trackers = self.bar = None
        self.log_lines = main and progress and not _is_terminal()
        if not main:
            return
        path = Path(out) / "metrics.jsonl"
        keep, sent_before = None, 0
        if start_step and path.is_file():  # a resumed run: forget what happened after the checkpoint
            keep = []
            for line in path.read_text().splitlines():
                try:
                    step = json.loads(line).get("step", 0)
                except (json.JSONDecodeError, AttributeError):  # a line cut short when the run died
                    continue
                sent_before = max(sent_before, step) if isinstance(step, int) else sent_before
                if step <= start_step:
                    keep.append(line)
        # the trackers start first: one that cannot start leaves metrics.jsonl as it was (and what it had sent)
        self.trackers = Trackers(report_to, Path(out), config, name, start_step, sent_before)
        if keep is not None:
            write_atomic(path, "".join(line + "\n" for line in keep))
        self.file = open(path, "a")
        if progress and _is_terminal():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, unit="update")

    def log(self, step: int, row: dict, show: dict | None = None) -> None:
        """One row of metrics at `step`; `show` = the few values a person sees (bar or log line)."""
        if not self.main:
            return
        try:
            self.file.write(json.dumps({"step": step, **row}) + "\n")
            self.file.flush()
        except OSError as e:  # a full disk: a torn last line is dropped when the run resumes
            raise RunError(f"writing {self.file.name} failed at step {step}: {e.strerror}; free space, then continue "
                           "with --resume (from the last checkpoint)") from None
        self.trackers.log(step, {k: v for k, v in row.items() if isinstance(v, (int, float))})
        if show:
            text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in show.items())
            if self.bar is not None:
                self.bar.set_postfix_str(text)
            elif self.log_lines:
                print(f"[run] step {step}/{self.total}: {text}", flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self, status: str = "finished") -> None:
        """Close the file, the bar and the trackers (`status`, what the trackers record: finished, failed or
        killed)."""
        if self.trackers is not None:
            self.trackers.close(status)
        for thing in (self.bar, self.file):
            if thing is not None:
                try:
                    thing.close()
                except OSError:  # a full disk already reported by log(); closing must not hide that error
                    pass
