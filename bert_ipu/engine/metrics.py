"""What a run reports as it goes: a JSON line per logged step (metrics.jsonl), TensorBoard scalars, and
progress for a person: a bar on a terminal, a plain log line every `log_every` updates otherwise (batch jobs,
cluster logs). Rank 0 speaks for the run; the other ranks report nothing.

After a resume, rows past the checkpoint's step are dropped from metrics.jsonl first, so no step appears
twice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..files import write_atomic
from .runtime import RunError


def _is_terminal() -> bool:
    return sys.stderr.isatty()


class MetricsLogger:
    def __init__(self, out: Path, main: bool, total_steps: int, start_step: int = 0, progress: bool = True,
                 desc: str = "training"):
        self.main, self.total = main, total_steps
        self.file = self.writer = self.bar = None
        self.log_lines = main and progress and not _is_terminal()
        if not main:
            return
        path = Path(out) / "metrics.jsonl"
        if start_step and path.is_file():  # a resumed run: forget what happened after the checkpoint
            keep = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= start_step:
                        keep.append(line)
                except (json.JSONDecodeError, AttributeError):  # a line cut short when the run died
                    continue
            write_atomic(path, "".join(line + "\n" for line in keep))
        self.file = open(path, "a")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=start_step + 1 if start_step else None)
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
        for k, v in row.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        if show:
            text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in show.items())
            if self.bar is not None:
                self.bar.set_postfix_str(text)
            elif self.log_lines:
                print(f"[run] step {step}/{self.total}: {text}", flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        for thing in (self.bar, self.file, self.writer):
            if thing is not None:
                try:
                    thing.close()
                except OSError:  # a full disk already reported by log(); closing must not hide that error
                    pass
