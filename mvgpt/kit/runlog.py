"""What a run writes as it goes: log.jsonl, TensorBoard's scalars and the progress bar.

- `RunLog`: one record a step to log.jsonl, its numbers to TensorBoard under runs/<run>, and the
  tqdm bar; a line at each evaluation, so a log file shows progress when the bar is off.
- `read_log`: log.jsonl up to the checkpoint's step, for a resumed run; a line cut short (a full
  disk, a power cut: often a tail of NUL bytes) is dropped with a one-line note, and the log
  rewritten atomically.
- TensorBoard is a view of the run, never a reason to lose it: once the disk says no, a one-line
  note, and the run goes on (log.jsonl has every step).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from mvgpt.kit.errors import UserError, again
from mvgpt.kit.io import write_text_atomic
from mvgpt.kit.runfolder import holds

# ----------------------------------------------------------------------------------------------
# The log: whole lines only


def read_log(path: str | os.PathLike, step: int) -> list[dict]:
    """The records of log.jsonl up to `step` (a resumed run's checkpoint), rewritten to those alone,
    so a resumed curve continues without a seam. A line cut short or padded with NUL bytes (a crash
    or a full disk while it was written) is dropped, with a one-line note."""
    path = Path(path)
    if not path.exists():
        return []
    kept, damaged = [], 0
    for line in path.read_bytes().split(b"\n"):
        line = line.strip(b"\x00 \r\t")
        if not line:
            continue
        try:
            record = json.loads(line)
            int(record["step"])
        except (ValueError, TypeError, KeyError):
            damaged += 1
            continue
        if record["step"] <= step:
            kept.append(record)
    if damaged:
        print(f"note: {path}: dropped {damaged} damaged line{'s' if damaged > 1 else ''} (cut short by a crash or "
              "a full disk); the records up to the checkpoint are kept")
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def append_line(path: Path, record: dict, step: int) -> None:
    """One record to log.jsonl; a full disk is one line (the checkpoint already saved is kept)."""
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise UserError(f"cannot write {path} at step {step} ({e.strerror}): free some space or fix the folder, "
                        f"then {again('continue with --resume')} (the last checkpoint is kept)") from None


def note(text: str) -> None:
    sys.stdout.write(f"note: {text}\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------------
# TensorBoard: a view of the run, never a reason to lose it


def _quiet_tensorboard_thread(args) -> None:
    """TensorBoard writes from a thread of its own; its OSError (a full disk) is told in one line by
    `Scalars` in the main thread, not as a second traceback from the thread."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _previous_hook(args)


_previous_hook = None


class Scalars:
    """TensorBoard scalars under runs/<run>, or, once the disk says no (full, read-only), none: a
    one-line note, and the run goes on (log.jsonl holds every step as well)."""

    def __init__(self, folder: str | os.PathLike, purge_step: int | None) -> None:
        global _previous_hook
        import threading

        if _previous_hook is None:
            _previous_hook = threading.excepthook
            threading.excepthook = _quiet_tensorboard_thread
        self.folder, self.writer = folder, None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder), purge_step=purge_step)
        except OSError as e:
            self._off(e)

    def add(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            try:
                self.writer.add_scalar(tag, value, step)
            except OSError as e:
                self._off(e)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as e:
                self._off(e)

    def _off(self, e: OSError) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass
        self.writer = None
        note(f"TensorBoard's log in {self.folder} is not written from here on ({e.strerror or e}): the run goes "
             "on, and log.jsonl has every step")


# ----------------------------------------------------------------------------------------------
# The run's log, as a loop writes it


# log.jsonl's keys and their TensorBoard tags, as pretraining writes them
TAGS = {"loss": "loss/train", "grad_norm": "grad_norm", "lr": "lr", "tokens_per_s": "tokens_per_s",
        "val_loss": "loss/held_out"}


def check_runs_dir(out_dir: Path, runs_dir: str | os.PathLike) -> None:
    """A one-line error where TensorBoard's folder for the run would be the run folder itself, or a
    folder that holds something else of ours: another run, the data, an export, a job."""
    folder = Path(runs_dir) / out_dir.name
    if os.path.realpath(folder) == os.path.realpath(out_dir):
        raise UserError(f"--runs-dir {runs_dir} would put TensorBoard's files in the run folder {out_dir} itself: "
                        "give TensorBoard a folder of its own (runs, the default)")
    found = holds(folder)
    if found is not None and found[0] != "files":
        raise UserError(f"--runs-dir {runs_dir} would put this run's TensorBoard files in {folder}, which holds "
                        f"{found[1]}: give TensorBoard a folder of its own (runs, the default)")


class RunLog:
    """log.jsonl (one record a step), TensorBoard scalars (`tags`: a record's keys and their tags) and
    the tqdm bar, written by rank 0 only (`master`); `say` writes a line above the bar."""

    def __init__(self, out_dir: Path, runs_dir: str | os.PathLike, step: int, total: int | None,
                 tags: dict[str, str] = TAGS, master: bool = True) -> None:
        self.master, self.path, self.tags = master, out_dir / "log.jsonl", tags
        if master:
            check_runs_dir(out_dir, runs_dir)
        self.scalars = Scalars(Path(runs_dir) / out_dir.name, purge_step=step + 1 if step else None) \
            if master else None
        self.bar = tqdm(total=total, initial=step, disable=None if master else True, unit="step", dynamic_ncols=True)

    def write(self, record: dict) -> None:
        if not self.master:
            return
        append_line(self.path, record, record["step"])
        for key, tag in self.tags.items():
            if key in record:
                self.scalars.add(tag, record[key], record["step"])
        if "loss" in record:  # a training step's record (an evaluation's alone has none)
            shown = {"loss": f"{record['loss']:.3f}"}
            if "tokens_per_s" in record:
                shown["tok_s"] = f"{record['tokens_per_s']:,.0f}"
            shown["min"] = f"{record['elapsed'] / 60:.1f}"
            self.bar.set_postfix(shown)
            self.bar.update(1)

    def say(self, text: str) -> None:
        if self.master:
            self.bar.write(text)
            sys.stdout.flush()

    def close(self) -> None:
        self.bar.close()
        if self.scalars:
            self.scalars.close()
