"""Disks and files as they fail on a shared cluster (docs/bad-inputs.md, "Disks and files").

A full disk, a read-only mount and a lock file that cannot be opened are made here the way
the kernel shows them to a process: one call raises the ``OSError`` it raises then (ENOSPC,
EDQUOT, EROFS, EPERM), or a library's own error for it (safetensors' text, observed on a
full tmpfs). The tests run as root, where ``chmod`` stops no write, and mounting a small or
read-only file system needs privileges CI does not have: so each test patches the one call
that would fail, at the lowest level the library reaches, and says which. Everything else
(the stage, its lifecycle, the rerun) runs for real through the command line.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from align.cli import main

DATE = "2026-01-01"
RESUMES = "then run the same command again: it resumes from what was written"


def run_main(args: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def one_line(err: str, stage: str) -> str:
    """The one error line the CLI printed for ``stage`` (no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith(f"align {stage}: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def annotated(rid: str) -> dict:
    completions = [{"text": f"c{i}", "num_tokens": 2, "finish_reason": "stop", "is_reference": True,
                    "source": "policy"} for i in range(4)]
    return {"id": rid, "messages": [{"role": "user", "content": "Is 4 even?"}], "answer": "yes",
            "completions": completions, "rewards": [0.0, 1.0, 0.5, 0.2], "reward_skips": [None] * 4}


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def fd_path(fd: int) -> str:
    """The file a descriptor is open on (Linux: /proc/self/fd)."""
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ALIGN_TRACEBACK", raising=False)
    for var in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """The tiny causal LM with the Apertus format installed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.chat import install_format
    from align.testing.tiny import save_tiny_models

    root = tmp_path_factory.mktemp("disk_models")
    source = save_tiny_models(root)["policy"]
    tokenizer, model = AutoTokenizer.from_pretrained(source), AutoModelForCausalLM.from_pretrained(source)
    install_format(tokenizer, model, chat_format="apertus")
    model.save_pretrained(root / "policy_apertus")
    tokenizer.save_pretrained(root / "policy_apertus")
    return root / "policy_apertus"


# --------------------------------------------------------------------------- a full disk


def fail_fsync_of(monkeypatch, name: str, code: int = errno.ENOSPC) -> list[str]:
    """The first fsync of the temp file written for ``name`` fails with ``code``: a full disk (or
    quota) as delayed allocation and network file systems report it, at fsync."""
    real, hit = os.fsync, []

    def fsync(fd: int) -> None:
        if not hit and os.path.basename(fd_path(fd)).startswith(f".{name}."):
            hit.append(fd_path(fd))
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return hit


def test_a_full_disk_while_pairs_writes_is_one_line_and_the_rerun_finishes(tmp_path, monkeypatch):
    rows = jsonl(tmp_path / "in.jsonl", [annotated(f"a{i}") for i in range(5)])
    out, reference = tmp_path / "out", tmp_path / "reference"
    assert run_main(["pairs", f"input={rows}", f"output_dir={reference}"])[0] == 0
    hit = fail_fsync_of(monkeypatch, "pairs.jsonl")
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 2 and hit
    assert one_line(err, "pairs").startswith(
        f"align pairs: DiskFullError: pairs: no space left on the device writing {out / 'pairs.jsonl'} (ENOSPC): "
        f"free space on the file system holding {out} (")
    assert err.rstrip().endswith(RESUMES)
    assert not (out / "_COMPLETE.json").exists() and not list(out.glob(".*.tmp"))  # no half file left
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 0, err
    assert (out / "pairs.jsonl").read_bytes() == (reference / "pairs.jsonl").read_bytes()
    assert (out / "_COMPLETE.json").is_file()


def test_a_full_disk_while_the_completion_marker_is_written_is_one_line_and_the_rerun_marks_it(tmp_path, monkeypatch):
    """The work is written; the marker that says so is not (the disk filled in between): one line naming the
    marker, and the rerun, finding the work, marks it."""
    rows = jsonl(tmp_path / "in.jsonl", [annotated(f"a{i}") for i in range(3)])
    out = tmp_path / "out"
    hit = fail_fsync_of(monkeypatch, "_COMPLETE.json")
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 2 and hit
    assert one_line(err, "pairs").startswith(
        f"align pairs: DiskFullError: pairs: no space left on the device writing {out / '_COMPLETE.json'} (ENOSPC): "
        f"free space on the file system holding {out} (")
    assert (out / "pairs.jsonl").is_file() and not (out / "_COMPLETE.json").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert run_main(["pairs", f"input={rows}", f"output_dir={out}"])[0] == 0
    assert (out / "_COMPLETE.json").is_file()


def test_an_odd_stage_lock_is_refused_in_the_stages_name(tmp_path):
    """The stage lock (the one a job's tasks share) is opened when the work starts: a directory in its place is
    refused naming the stage, the lock and what to do."""
    rows = jsonl(tmp_path / "in.jsonl", [annotated("a")])
    out = tmp_path / "out"
    (out / ".align-stage.lock").mkdir(parents=True)
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 2
    assert one_line(err, "pairs").startswith(
        f"align pairs: InputError: pairs: {out / '.align-stage.lock'} is a directory, not a lock file this library "
        "writes; remove it")


def test_a_finished_output_whose_manifest_file_was_damaged_is_still_done(tmp_path, capsys):
    """The completion marker holds the manifest: a `_manifest.json` cut short after the run finished changes
    nothing (a rerun skips)."""
    rows = jsonl(tmp_path / "in.jsonl", [annotated("a")])
    out = tmp_path / "out"
    assert run_main(["pairs", f"input={rows}", f"output_dir={out}"])[0] == 0
    (out / "_manifest.json").write_text('{"stage": "pa')
    rc, printed, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 0 and "already complete; skipping" in printed, err


def test_a_used_up_quota_says_to_free_quota(tmp_path, monkeypatch):
    rows = jsonl(tmp_path / "in.jsonl", [annotated("a")])
    fail_fsync_of(monkeypatch, "pairs.jsonl", errno.EDQUOT)
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={tmp_path / 'out'}"])
    assert rc == 2
    line = one_line(err, "pairs")
    assert line.startswith("align pairs: DiskFullError: pairs: the disk quota is used up writing ")
    assert "(EDQUOT): free some of your quota (or ask for more) on the file system holding" in line


def test_a_full_disk_while_sampling_keeps_the_shard_and_the_rerun_resumes(tmp_path, monkeypatch, policy,
                                                                          one_torch_thread):
    """The shard's third line is cut short by the kernel (a short write, then ENOSPC), as a disk that
    fills mid-line does; the rerun drops the torn line and samples only the prompts not written."""
    prompts = jsonl(tmp_path / "prompts.jsonl", [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Is {i} "
                                                                                                          "even?"}]}
                                                 for i in range(6)])
    out = tmp_path / "out"
    args = ["sample", f"prompts={prompts}", f"output_dir={out}", "sampler.backend=transformers",
            f"sampler.model={policy}", "sampler.chat_format=apertus", f"sampler.chat_date={DATE}",
            "sampler.device=cpu", "max_tokens=4", "n=2", "batch_size=1"]
    real, lines = os.write, []

    def write(fd: int, data) -> int:
        if not fd_path(fd).endswith("shard-00000-of-00001.jsonl"):
            return real(fd, data)
        lines.append(bytes(data))
        if len(lines) == 3:
            return real(fd, bytes(data)[:10])  # the room left: ten bytes of the line
        if len(lines) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    rc, _, err = run_main(args)
    assert rc == 2
    shard = out / "shard-00000-of-00001.jsonl"
    assert one_line(err, "sample").startswith(
        f"align sample: DiskFullError: sample: no space left on the device writing {shard} (ENOSPC): free space on "
        f"the file system holding {out} (")
    kept = shard.read_bytes()
    assert kept.count(b"\n") == 2 and not kept.endswith(b"\n")  # two whole lines and a torn one
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_main(args)
    assert rc == 0, err
    from align.io import read_records

    rows = read_records(out)
    assert sorted(r["id"] for r in rows) == [f"p{i}" for i in range(6)]  # each once
    assert shard.read_bytes().startswith(b"".join(lines[:2]))  # the two whole lines kept, not sampled again


def test_a_full_disk_while_sft_saves_names_what_the_model_needs_and_the_rerun_saves_it(tmp_path, monkeypatch, policy,
                                                                                      one_torch_thread):
    """safetensors' own error for a full disk (its text, as a full tmpfs gives it) when the model is saved."""
    import transformers.modeling_utils as modeling
    from safetensors import SafetensorError

    rows = jsonl(tmp_path / "sft.jsonl", [{"id": f"s{i}", "messages": [
        {"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "yes"}]} for i in range(4)])
    out = tmp_path / "sft"
    args = ["sft", f"input={rows}", f"output_dir={out}", f"model_name_or_path={policy}", "use_cpu=true", "bf16=false",
            "report_to=[]", "max_steps=1", "optimizer=adamw", "per_device_train_batch_size=2", "save_strategy='no'",
            "disable_tqdm=true"]
    real = modeling.safe_save_file

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling, "safe_save_file", full)
    rc, _, err = run_main(args)
    assert rc == 2
    weights = sum(p.stat().st_size for p in policy.glob("*.safetensors"))
    from align.io.disk import size_text

    line = one_line(err, "sft")
    assert line.startswith(f"align sft: DiskFullError: sft: no space left on the device writing {out} (ENOSPC): "
                           f"free space on the file system holding {out} (")
    assert f"the stage needs about {size_text(weights)} there to save its model), {RESUMES}" in line
    assert not (out / "_COMPLETE.json").exists()
    monkeypatch.setattr(modeling, "safe_save_file", real)
    rc, _, err = run_main(args)
    assert rc == 0, err
    assert (out / "model.safetensors").is_file() and (out / "_COMPLETE.json").is_file()


def test_a_torch_write_failure_counts_as_a_full_disk_only_on_a_full_file_system(tmp_path, monkeypatch):
    """torch's stream writer says no errno: the file system's free space decides."""
    from align.errors import DiskFullError
    from align.io import disk

    failure = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    class Full:
        f_bavail, f_frsize = 3, 4096

    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    assert isinstance(disk.disk_error("sft", tmp_path, failure), DiskFullError)
    Full.f_bavail = 1 << 20
    assert disk.disk_error("sft", tmp_path, failure) is None  # room left: a bug of another kind, kept as it is
    with pytest.raises(RuntimeError, match="unexpected pos"), disk.writing("sft", tmp_path):
        raise failure


def test_a_permission_error_outside_the_output_is_not_taken_for_a_read_only_output(tmp_path):
    """EACCES on a file the stage reads elsewhere is not a refused write: it keeps its own error."""
    from align.errors import NotWritableError
    from align.io import disk

    elsewhere = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "input.jsonl"))
    assert disk.disk_error("pairs", tmp_path / "out", elsewhere) is None
    inside = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "out" / "pairs.jsonl"))
    error = disk.disk_error("pairs", tmp_path / "out", inside)
    assert isinstance(error, NotWritableError) and isinstance(error, OSError) and error.errno == errno.EACCES
    assert str(error) == (f"pairs: {tmp_path / 'out' / 'pairs.jsonl'} cannot be written: permission denied (no write "
                          "permission) (EACCES): make it writable (a read-only mount: remount it read-write) or choose "
                          f"another output_dir, {RESUMES}")


# --------------------------------------------------------------------------- a read-only mount


def read_only(monkeypatch, directory: Path) -> None:
    """``directory`` as a read-only mount shows itself: ``access(W_OK)`` says no, and every call that
    would create, open for writing, rename or remove a file under it raises EROFS."""
    top = os.path.realpath(directory)

    def under(path) -> bool:
        real = os.path.realpath(os.fsdecode(path))
        return real == top or real.startswith(top + os.sep)

    def refuse(path) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_access, real_open, real_mkdir = os.access, os.open, os.mkdir
    real_replace, real_unlink, real_rename = os.replace, os.unlink, os.rename
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def access(path, mode, *args, **kwargs):
        return False if mode & os.W_OK and under(path) else real_access(path, mode, *args, **kwargs)

    def open_(path, flags, *args, **kwargs):
        if flags & writes and under(path):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if under(path):
            if os.path.isdir(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def guarded(real):
        def call(source, *rest, **kwargs):
            if under(source) or (rest and under(rest[0])):
                refuse(source)
            return real(source, *rest, **kwargs)
        return call

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "replace", guarded(real_replace))
    monkeypatch.setattr(os, "unlink", guarded(real_unlink))
    monkeypatch.setattr(os, "rename", guarded(real_rename))


def finished_pairs_recipe(tmp_path: Path) -> tuple[Path, Path]:
    """A pipeline recipe of one pairs step, run to completion; its lock files then removed, as a copy
    of the output onto another (read-only) mount would hold none."""
    rows = jsonl(tmp_path / "in.jsonl", [annotated(f"a{i}") for i in range(3)])
    out = tmp_path / "mounted" / "pairs"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"pairs: {{input: {rows}, output_dir: {out}}}\n")
    rc, _, err = run_main(["pipeline", recipe])
    assert rc == 0, err
    for lock in out.glob(".align-*.lock"):
        lock.unlink()
    return recipe, out


def test_a_finished_output_on_a_read_only_mount_is_skipped_without_a_lock(tmp_path, monkeypatch):
    recipe, out = finished_pairs_recipe(tmp_path)
    before = sorted(p.name for p in out.iterdir())
    read_only(monkeypatch, out.parent)
    for command in (["pipeline", recipe], ["step", recipe, "pairs"]):
        rc, stdout, err = run_main(command)
        assert rc == 0, err
        assert "is already complete; skipping" in stdout
        assert sorted(p.name for p in out.iterdir()) == before  # no .align-writer.lock, no .align-stage.lock


def test_an_unfinished_output_on_a_read_only_mount_is_one_line_naming_it(tmp_path, monkeypatch):
    recipe, out = finished_pairs_recipe(tmp_path)
    read_only(monkeypatch, out.parent)
    rc, _, err = run_main(["pipeline", recipe, "pairs.overwrite=true", "pairs.seed=3"])
    assert rc == 2
    assert one_line(err, "pipeline") == (
        f"align pipeline: NotWritableError: pairs: output_dir={str(out)!r}: {str(out)!r} is not writable (a "
        "read-only mount, or no write permission): make it writable, or choose another output_dir")


def test_a_read_only_lock_file_is_one_line_naming_it(tmp_path, monkeypatch):
    """The writability probe passes (a mount turned read-only after it), the writer lock is refused EROFS."""
    rows = jsonl(tmp_path / "in.jsonl", [annotated("a")])
    out = tmp_path / "out"
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if os.fsdecode(path).endswith(".align-writer.lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 2
    assert one_line(err, "pairs") == (
        f"align pairs: NotWritableError: pairs: {out / '.align-writer.lock'} cannot be written: the file system is "
        "read-only (EROFS): make it writable (a read-only mount: remount it read-write) or choose another "
        f"output_dir, {RESUMES}")


def test_an_immutable_writer_lock_is_one_line_saying_what_to_remove(tmp_path, monkeypatch):
    """``chattr +i`` on the lock: opening it for writing gives EPERM, even to root (simulated: chattr
    needs a file system that supports it)."""
    rows = jsonl(tmp_path / "in.jsonl", [annotated("a")])
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".align-writer.lock"
    lock.write_text("")
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if os.fsdecode(path) == str(lock) and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    rc, _, err = run_main(["pairs", f"input={rows}", f"output_dir={out}"])
    assert rc == 2
    assert one_line(err, "pairs") == (
        f"align pairs: InputError: pairs: {lock} cannot be opened for writing (Operation not permitted): remove it "
        "(an immutable file: chattr -i it first), then run again")
    assert not (out / "_manifest.json").exists()  # refused before the first write


# --------------------------------------------------------------------------- text files: UTF-8, and regular


def test_every_text_file_reader_names_the_file_and_the_byte(tmp_path):
    """One reader for the text files a user writes: UTF-8 whatever the locale; a byte that is not is
    an error naming the file, its offset and line; a FIFO is refused, never read (it would block)."""
    from align.errors import ConfigError, InputError
    from align.io.files import read_text

    latin = tmp_path / "notes.md"
    latin.write_bytes("first line\nnaïve café\n".encode("latin-1"))
    with pytest.raises(InputError) as info:
        read_text(latin, what="charter")
    assert str(info.value).startswith(f"charter {latin}: not UTF-8 text: byte 13 (line 2) is b'\\xef'")
    fifo = tmp_path / "queue.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_text(fifo, error=ConfigError)
    (tmp_path / "ok.txt").write_bytes("é\n".encode())
    assert read_text(tmp_path / "ok.txt") == "é\n"
    from rewards.charter import load_template

    template = tmp_path / "judge.txt"
    template.write_bytes("Rate $completion, café.\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"^prompt template .*judge\.txt: not UTF-8 text: byte 21 \(line 1\)"):
        load_template(template)


def test_plan_traces_a_model_through_the_recipes_its_lineage_line_names(tmp_path):
    """The lineage comes from the files the recipe names, not from every *.yaml beside it."""
    from align.drivers.plan import plan_recipe
    from align.plan.recipe_plan import PlanSettings

    shutil.copy(Path(__file__).resolve().parents[1] / "recipes/apertus-8b/sft.yaml", tmp_path / "sft.yaml")
    recipe = tmp_path / "qrpo.yaml"
    recipe.write_text("# align train qrpo.yaml\n# lineage: sft.yaml   (where runs/apertus-8b/sft comes from)\n"
                      "model_name_or_path: runs/apertus-8b/sft\ninput: pairs\noutput_dir: runs/apertus-8b/qrpo\n")
    (tmp_path / "notes.yaml").write_bytes("owner: José\n".encode("latin-1"))
    os.mkfifo(tmp_path / "queue.yaml")
    (plan,), _ = plan_recipe(PlanSettings(recipe=str(recipe)))
    assert "swiss-ai/Apertus-8B-2509" in plan.model_source
    recipe.write_text(recipe.read_text().replace("# lineage: sft.yaml", "# lineage: queue.yaml"))
    from align.errors import ConfigError

    with pytest.raises(ConfigError, match=r"lineage .*queue\.yaml: not a regular file"):
        plan_recipe(PlanSettings(recipe=str(recipe)))
