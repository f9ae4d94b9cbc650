import argparse
import errno
import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from mvgpt.kit import errors, runfolder
from mvgpt.kit.errors import UserError, run_main


@pytest.mark.parametrize("check, text, value", [
    (errors.positive_int, "3", 3),
    (errors.non_negative_int, "0", 0),
    (errors.positive_float, "1e-4", 1e-4),
    (errors.non_negative_float, "0", 0.0),
    (errors.share, "1", 1.0),
    (errors.at_least(-1), "-1", -1),
])
def test_checks_return_good_values(check, text, value):
    got = check(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("check, text, message", [
    (errors.positive_int, "0", "0 is out of range: give a whole number >= 1"),
    (errors.positive_int, "1.5", "'1.5' is not a number: give a whole number >= 1"),
    (errors.non_negative_int, "-1", "-1 is out of range: give a whole number >= 0"),
    (errors.positive_float, "0", "0 is out of range: give a number above 0"),
    (errors.positive_float, "nan", "nan is not a finite number: give a number above 0"),
    (errors.positive_float, "inf", "inf is not a finite number: give a number above 0"),
    (errors.non_negative_float, "-0.5", "-0.5 is out of range: give a number >= 0"),
    (errors.share, "1.01", "1.01 is out of range: give a number from 0 to 1"),
    (errors.share, "-3", "-3 is out of range: give a number from 0 to 1"),
    (errors.share, "half", "'half' is not a number: give a number from 0 to 1"),
])
def test_checks_say_what_is_wrong_and_what_would_do(check, text, message):
    with pytest.raises(errors.argparse.ArgumentTypeError) as e:
        check(text)
    assert str(e.value) == message


def test_writable_paths_are_checked_without_leaving_anything(tmp_path):
    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "new" / "deeper" / "out.json")
    assert runfolder.writable_file(out) == out
    assert errors.writable_folder(str(tmp_path / "made" / "later")) == str(tmp_path / "made/later")
    (tmp_path / "old.json").write_text('{"steps": 1}\n')
    assert runfolder.writable_file(str(tmp_path / "old.json")) == str(tmp_path / "old.json")  # an earlier summary
    for check, text, message in [
        (runfolder.writable_file, tmp_path / "file", f"{tmp_path}/file is there already and is not JSON: it is "
                                                     "replaced only when it is an earlier summary: pick another file"),
        (runfolder.writable_file, tmp_path, f"{tmp_path} is a folder: give a file name"),
        (runfolder.writable_file, tmp_path / "file" / "out.json",
         f"cannot write {tmp_path}/file/out.json: {tmp_path}/file is a file, not a folder"),
        (errors.writable_folder, tmp_path / "file", f"{tmp_path}/file is a file: give a folder"),
        (errors.writable_folder, tmp_path / "file" / "sub", f"cannot write {tmp_path}/file/sub: "
                                                            f"{tmp_path}/file is a file, not a folder"),
    ]:
        with pytest.raises(errors.argparse.ArgumentTypeError) as e:
            check(str(text))
        assert str(e.value) == message
    if os.geteuid() != 0:  # root may write anywhere
        (tmp_path / "locked").mkdir(mode=0o500)
        with pytest.raises(errors.argparse.ArgumentTypeError, match="Permission denied"):
            runfolder.writable_file(str(tmp_path / "locked" / "out.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] + (["locked"] if os.geteuid() else []) + ["old.json"]
    assert (tmp_path / "file").read_text() == "x"


def test_a_bad_flag_is_one_line(capsys):
    p = errors.ArgumentParser(prog="x.py")
    p.add_argument("--n", type=errors.positive_int)
    p.add_argument("--kind", choices=["a", "b"])
    for argv, message in [(["--n", "0"], "argument --n: 0 is out of range: give a whole number >= 1"),
                          (["--kind", "c"], "argument --kind: invalid choice: 'c' (choose from 'a', 'b')"),
                          (["--what"], "unrecognized arguments: --what")]:
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        assert e.value.code == 2 and capsys.readouterr().err == f"error: {message} (see x.py --help)\n"


def raises(exc):
    def main():
        raise exc
    return main


@pytest.mark.parametrize("exc, line", [
    (UserError("--lr must be finite: give a number"), None),  # SystemExit: Python prints it, exit 1
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "ckpt/x.pt"),
     "error: No such file or directory: ckpt/x.pt: check the path\n"),
    (PermissionError(errno.EACCES, "Permission denied", "/out"),
     "error: Permission denied (/out): pick a path you can write, or fix its permissions\n"),
    (OSError(errno.ENOSPC, "No space left on device", "data/train.bin"),
     "error: the disk is full (data/train.bin): free some space and run again\n"),
    (OSError(errno.EFBIG, "File too large", "data/train.bin"),  # `ulimit -f`: no room either, another fix
     "error: a file grew past the size this system allows (File too large: `ulimit -f`, or the file system's limit) "
     "(data/train.bin): raise the limit, or write elsewhere, and run again\n"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/x"),
     "error: Read-only file system (/ro/x): pick a path you can write, or fix its permissions\n"),
])
def test_users_and_machines_errors_are_one_line(capsys, exc, line):
    with pytest.raises(SystemExit) as e:
        run_main(raises(exc))
    if line is None:
        assert e.value is exc and e.value.code == "error: --lr must be finite: give a number"
    else:
        assert e.value.code == 1 and capsys.readouterr().err == line


@pytest.mark.parametrize("exc", [ZeroDivisionError("a bug"), KeyError("a bug"),
                                 OSError(errno.EIO, "Input/output error")])
def test_bugs_keep_their_traceback(exc):
    with pytest.raises(type(exc)):
        run_main(raises(exc))


def script(body: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{body}"]


# 'ready' is printed inside run_main: a Ctrl-C before its try: would be a plain KeyboardInterrupt
SLEEPER = ("import time\nfrom mvgpt.kit.errors import run_main\n"
           "run_main(lambda: (print('ready', flush=True), time.sleep(60)))")
PIPE = "from mvgpt.kit.errors import run_main\nrun_main(lambda: [print('line', i, flush=True) for i in range(10**6)])"


def test_ctrl_c_is_one_line_and_exit_130():
    child = subprocess.Popen(script(SLEEPER), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130 and err == "interrupted (Ctrl-C): run the command again to start over\n"


def test_ctrl_c_while_a_script_imports_torch_is_one_line_and_exit_130(tmp_path):
    """Before run_main: a Ctrl-C while the imports run (a second or two, torch's) ends in one line too."""
    (tmp_path / "scripts").mkdir()
    starting = tmp_path / "scripts" / "starting.py"  # a script in scripts/, as ours are
    starting.write_text("import mvgpt.kit.starting\nimport os, signal, time\n"
                        "os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C lands while torch loads\n"
                        "time.sleep(60)\n")
    done = subprocess.run([sys.executable, str(starting)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (done.returncode, done.stdout, done.stderr) == (
        130, "", "interrupted (Ctrl-C) while starting: nothing was changed\n")
    # run by the main job: its advice too; and the stop holds even where torch's import would swallow SystemExit
    done = subprocess.run([sys.executable, str(starting)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), MVGPT_JOB_AGAIN="run main.py again"))
    assert (done.returncode, done.stderr) == (130, "interrupted (Ctrl-C) while starting: nothing was changed: "
                                                   "run main.py again\n")


def test_a_ctrl_c_swallowed_by_an_import_still_stops_the_script(tmp_path):
    """The line is written and the process ends in the handler itself: a SystemExit raised there could be
    caught by the code it interrupted (torch's C start-up runs numpy's import, which did) and the script
    would run on, with Ctrl-C ignored."""
    (tmp_path / "scripts").mkdir()
    script_ = tmp_path / "scripts" / "swallowed.py"
    script_.write_text("import mvgpt.kit.starting\nimport os, signal, time\n"
                       "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)\n"
                       "except BaseException:\n    pass  # as an import that catches what it raised\n"
                       "print('ran on')\n")
    done = subprocess.run([sys.executable, str(script_)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (done.returncode, done.stdout) == (130, "")


def test_a_dev_script_asks_for_the_guard_and_a_test_importing_it_is_left_alone():
    code = ("import signal, sys; sys.path.insert(0, 'dev'); import same_tokens; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.stdout == "True\n", done.stderr


def test_every_script_imports_the_ctrl_c_guard_before_anything_else():
    import ast

    for script in sorted((ROOT / "scripts").glob("*.py")):
        imports = [node for node in ast.parse(script.read_text()).body if isinstance(node, ast.Import | ast.ImportFrom)]
        first = next(node for node in imports if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"))
        assert [alias.name for alias in first.names] == ["mvgpt.kit.starting"], script.name


def test_importing_mvgpt_outside_a_script_leaves_ctrl_c_alone():
    code = "import signal, mvgpt.kit.starting; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.stdout == "True\n"


def test_a_reader_that_leaves_is_no_traceback():
    child = subprocess.Popen(script(PIPE), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout.readline() == b"line 0\n"
    child.stdout.close()  # as `| head -1` does
    assert child.wait(timeout=60) == 1 and child.stderr.read() == b""


MAIN_STEP = f"""
import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r})
import os, main
from mvgpt.kit.errors import JOB_AGAIN, run_main
run_main(lambda: main.run(["-c", {SLEEPER!r}], dict(os.environ, **{{JOB_AGAIN: "run main.py again"}})),
         interrupted="run main.py again")
"""


@pytest.mark.parametrize("group", [False, True], ids=["main-only", "terminal"])
def test_ctrl_c_in_main_stops_its_step_and_says_so_once(group):
    """main.py's step gets Ctrl-C whether the terminal sends it to both or only main gets it."""
    child = subprocess.Popen(script(MAIN_STEP), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    for line in child.stdout:  # main's "$ python ..." line, then the step's
        if line == "ready\n":
            break
    if group:
        os.killpg(child.pid, signal.SIGINT)
    else:
        child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    # one line, the step's, with the job's advice (main.py's, not the step's own command line's)
    assert child.returncode == 130 and err == "interrupted (Ctrl-C): run main.py again\n"


def test_an_output_through_a_symbolic_link_writes_its_target_and_a_device_is_refused(tmp_path):
    from mvgpt.kit.io import write_json

    (tmp_path / "target.json").write_text('{"mine": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    assert runfolder.writable_file(str(tmp_path / "link.json")) == str(tmp_path / "link.json")
    write_json(tmp_path / "link.json", {"ours": 2})
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "target.json").read_text()) == {"ours": 2}
    (tmp_path / "full.json").symlink_to("/dev/null")  # a device: no file to replace in one step
    with pytest.raises(argparse.ArgumentTypeError, match="full.json is not a file \\(a device or a pipe\\)"):
        runfolder.writable_file(str(tmp_path / "full.json"))
    with pytest.raises(UserError, match="/dev/null is not a file \\(a device or a pipe\\): give a file to write"):
        write_json(tmp_path / "full.json", {})


def test_an_output_linked_to_a_runs_file_or_a_checkpoint_is_refused_by_what_it_names(tmp_path):
    """A link's own folder holds no run: the file it names does. Writing through it would replace a checkpoint."""
    run = tmp_path / "checkpoints" / "pretrain"
    run.mkdir(parents=True)
    (run / "ckpt.pt").write_bytes(b"PK\x03\x04 a checkpoint")
    (tmp_path / "link.gguf").symlink_to(run / "ckpt.pt")
    with pytest.raises(UserError) as e:
        runfolder.claim_file(tmp_path / "link.gguf", "OUT")
    assert str(e.value.code).startswith(f"error: {tmp_path}/link.gguf is part of a run (ckpt.pt) in {run}")
    (tmp_path / "summary.json").symlink_to(tmp_path / "new" / "ckpt.pt")  # the run this command is about to make
    with pytest.raises(UserError) as e:
        runfolder.claim_file(tmp_path / "summary.json", "--json",
                             making=[("--out-dir", tmp_path / "new", "checkpoint")])
    assert str(e.value.code) == (f"error: --json {tmp_path}/summary.json is a file of --out-dir {tmp_path}/new, which "
                                 "this command writes: pick another file")
    (tmp_path / "my.pt").write_bytes(b"PK\x03\x04 a checkpoint outside any run folder")
    with pytest.raises(argparse.ArgumentTypeError, match="my.pt is there already and is not JSON"):
        runfolder.writable_file(str(tmp_path / "my.pt"))
    assert (run / "ckpt.pt").read_bytes() == b"PK\x03\x04 a checkpoint"
