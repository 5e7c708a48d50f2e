"""The local engine's ``file://`` outputs follow the artifact rules (docs/artifacts.md, "The local engine"): a job
that fails publishes nothing, a retrain into the same directory yields exactly the new file set, a reader racing
a retrain sees the old model or the new one, and the nodes of one job publish one model. Real supervisors and
trainer processes, the trainers writing through ``output_dir()``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bounds import HANG
from trainflow.core import JobState, TrainJobFailed
from trainflow.core.local.engine import LocalBackend

pytestmark = pytest.mark.timeout(2 * HANG)  # a backstop above the waits' own hang detector

WRITE = """
import json, os, sys
from trainflow.core import output_dir
files = json.loads(sys.argv[1])
out = output_dir()
node = os.environ.get("PET_NODE_RANK", "0")
for rel, text in files.items():
    path = out / rel.replace("{node}", node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
sys.exit(int(sys.argv[2]))
"""

OLD = {"index.json": '{"shards": 2}', "shard-1.bin": "1" * 1000, "shard-2.bin": "2" * 1000}
NEW = {"config.json": '{"a": 1}', "weights.bin": "w" * 30_000, "z/tokenizer.json": "{}"}


@pytest.fixture
def backend(tests_backend: LocalBackend) -> LocalBackend:
    return tests_backend  # conftest's: a local engine of this test's own, its jobs cancelled afterwards


def train(
    backend: LocalBackend, name: str, target: Path, files: dict[str, str], code: int = 0, nodes: int = 1
):  # type: ignore[no-untyped-def]
    import json

    ref = backend.submit(
        {
            "name": name,
            "command": ["python3", "-c", WRITE, json.dumps(files), str(code)],
            "num_nodes": nodes,
            "output_uri": target.as_uri(),
        }
    )
    return backend.wait(ref, timeout=HANG, raise_on_failure=False)


def raise_it(error: OSError) -> None:
    raise error


def read_all(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def siblings(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name != target.name)


def test_a_retrain_yields_exactly_the_new_files_and_a_failed_one_publishes_nothing(
    backend: LocalBackend, tmp_path: Path
) -> None:
    target = tmp_path / "models" / "m"
    first = train(backend, "first", target, OLD)
    assert first.state is JobState.COMPLETE and first.output_uri == target.as_uri()
    assert read_all(target) == OLD

    second = train(backend, "second", target, NEW)
    assert second.state is JobState.COMPLETE
    assert read_all(target) == NEW, "a retrain into the same directory mixed the two models"
    # the model replaced stays beside it until the next publish, for a reader that opened it before the swap
    assert siblings(target) == [".m.trainflow-replaced"], "the publish left another tree beside the model"
    assert read_all(target.parent / ".m.trainflow-replaced") == OLD

    failed = train(backend, "failed", target, {"half.bin": "h"}, code=3)
    assert failed.state is JobState.FAILED
    assert read_all(target) == NEW, "a failed job changed the published model"
    staged = backend.job_dir("failed") / "output-staging"
    assert read_all(staged) == {"half.bin": "h"}, "the failed job's files stay in its own directory"


def test_a_reader_racing_retrains_sees_one_whole_model(backend: LocalBackend, tmp_path: Path) -> None:
    """The reader opens the directory once and reads every file relative to it (as a loader holding the
    directory does); each snapshot it completes is one model, never a mix."""
    target = tmp_path / "race"
    assert train(backend, "r0", target, OLD).state is JobState.COMPLETE
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            try:
                snap = {}
                for dirpath, _dirs, files, dfd in os.fwalk(dir_fd=fd, onerror=raise_it):
                    for name in files:
                        with open(os.open(name, os.O_RDONLY, dir_fd=dfd)) as fh:
                            snap[os.path.normpath(os.path.join(dirpath, name))] = fh.read()
                if os.fstat(fd).st_nlink == 0:
                    continue  # the tree was deleted while being read (a later swap): not a whole read
                seen.append(snap)
            except FileNotFoundError:
                continue  # the tree was deleted under the reader after a swap: it starts again
            finally:
                os.close(fd)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(4):
            assert train(backend, f"r{i + 1}", target, NEW if i % 2 == 0 else OLD).state is JobState.COMPLETE
    finally:
        done.set()
        thread.join()
    assert OLD in seen and NEW in seen, f"the reader did not see both models in {len(seen)} reads"
    mixed = [sorted(s) for s in seen if s not in (OLD, NEW)]
    assert not mixed, f"{len(mixed)} of {len(seen)} reads saw a mix, e.g. {mixed[0]}"


def test_the_nodes_of_one_job_publish_one_model(backend: LocalBackend, tmp_path: Path) -> None:
    target = tmp_path / "sharded"
    result = train(backend, "two", target, {"shard-{node}.bin": "s", "index-{node}.json": "{}"}, nodes=2)
    assert result.state is JobState.COMPLETE
    assert sorted(read_all(target)) == ["index-0.json", "index-1.json", "shard-0.bin", "shard-1.bin"]


def test_a_target_that_is_a_file_fails_the_job_naming_it(backend: LocalBackend, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a model directory")
    with pytest.raises(TrainJobFailed, match=f"{target} is not a directory"):
        backend.wait(
            backend.submit(
                {
                    "name": "f",
                    "command": ["python3", "-c", WRITE, '{"a": "b"}', "0"],
                    "output_uri": str(target),
                }
            ),
            timeout=HANG,
        )
    assert target.read_text() == "not a model directory"
    assert backend.get("f").reason == "OutputPublishFailed"


def test_an_output_on_another_filesystem_is_copied_then_swapped(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The job directory and the output on two filesystems (/dev/shm, a tmpfs, beside the disk): the staged
    tree is copied beside the output and swapped in; the job directory keeps no second copy."""
    import shutil
    import tempfile

    assert os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev, "this test needs /dev/shm on its own mount"
    root = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="trainflow-test-"))
    try:
        target = root / "model"
        assert train(backend, "x1", target, OLD).state is JobState.COMPLETE
        assert train(backend, "x2", target, NEW).state is JobState.COMPLETE
        assert read_all(target) == NEW and siblings(target) == [".model.trainflow-replaced"]
        assert not (backend.job_dir("x2") / "output-staging").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
