"""examples/cv_example.py and examples/complete_cv_example.py end to end on the CPU: real JPEG and
PNG files (scikit-learn's hand-written digits, written by examples/make_demo_images.py), real
torch and Accelerate, real `mpslaunch launch` processes, a real pseudo-terminal for the progress
bar, a real full disk (a small tmpfs, as root). The model is small (squeezenet1_1, which has
dropout, so resuming must restore the random state too) and the images tiny.

Each run uses one compute thread (OMP_NUM_THREADS=1): on a shared 2-core machine, OpenMP threads
plus DataLoader workers oversubscribe the cores. Nothing here measures speed."""

from __future__ import annotations

import importlib.util
import fcntl
import io
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import zlib
from pathlib import Path

import psutil
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
import torchvision
from torchvision.io import encode_png

from helpers import small_disk as mounted_small_disk
from helpers import two_gloo_ranks_ended_well

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec; they still work. Every
# test trains an example, most through the CLI: slow, all of them.
pytestmark = [pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning"),
              pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["--model", "squeezenet1_1", "--image_size", "24", "--batch_size", "4", "--cpu"]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = load_example("make_demo_images")
cv_example = load_example("cv_example")  # each runs alone: nothing shared between them
complete = load_example("complete_cv_example")


def command(example: str, *args, launcher: list[str] | None = None) -> list[str]:
    prefix = [sys.executable, "-m", "mpslaunch", "launch", *launcher] if launcher is not None \
        else [sys.executable]
    return [*prefix, str(EXAMPLES / f"{example}.py"), *map(str, args)]


def run(example: str, *args, launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command(example, *args, launcher=launcher), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def start(example: str, *args, launcher: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(command(example, *args, launcher=launcher), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def assert_ran(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def assert_two_ranks_ran(result: subprocess.CompletedProcess) -> None:
    assert two_gloo_ranks_ended_well(result), result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def read_metrics(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


def assert_trained(metrics: dict, *, epochs: int, images: int, processes: int) -> None:
    assert len(metrics["eval_accuracy_per_epoch"]) == epochs
    assert 0 <= metrics["eval_accuracy"] == metrics["eval_accuracy_per_epoch"][-1] <= 1
    assert (metrics["train_images"], metrics["eval_images"]) == (images - images // 5, images // 5)
    assert (metrics["device"], metrics["mixed_precision"]) == ("cpu", "no")
    assert metrics["num_processes"] == processes


def epoch_lines(example: str, output: str) -> list[str]:
    return re.findall(rf"^{example}: epoch \d+/\d+: loss \d+\.\d{{3}}, [\d,]+ training images/s, "
                      r"eval accuracy [01]\.\d{4}$", output, flags=re.MULTILINE)


def assert_logged_per_epoch(result: subprocess.CompletedProcess, example: str, epochs: int):
    """In a log (no terminal): one line per epoch, and no progress bar."""
    assert len(epoch_lines(example, result.stdout)) == epochs, result.stdout
    assert "\r" not in result.stderr and "img/s" not in result.stderr, result.stderr[-3000:]


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with_rows_missing(side: int = 64, rows: int = 10) -> bytes:
    """A side x side RGB PNG whose whole, valid compressed stream holds only `rows` rows."""
    pixels = b"".join(b"\0" + bytes((x + y) % 256 for x in range(side * 3)) for y in range(rows))
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header)
            + png_chunk(b"IDAT", zlib.compress(pixels)) + png_chunk(b"IEND", b""))


def wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not path.exists():
        assert process.poll() is None, "finished before it could be interrupted"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def latest_checkpoint(output_dir: Path) -> Path:
    return max((output_dir / "checkpoints").glob("step_*[0-9]"))


def latest_step(output_dir: Path) -> int:
    return int(latest_checkpoint(output_dir).name.split("_")[1])


@pytest.fixture(scope="module")
def pets(tmp_path_factory) -> Path:
    """200 digits as Label_123 files, every suffix spelling, and a macOS `._` file to ignore."""
    folder = tmp_path_factory.mktemp("pets")
    paths = demo.write_demo_images(folder, count=200, size=24, seed=1)
    for path, suffix in zip(paths[::4], [".JPG", ".jpeg", ".JPEG"] * 100):
        path.rename(path.with_suffix(suffix))
    (folder / "._seven_0001.jpg").write_bytes(b"macOS metadata, not an image")
    return folder


# ---------------------------------------------------------------- cv_example


def test_cv_example_through_the_launcher(pets, tmp_path):
    result = run("cv_example", "--data_dir", pets, "--output_dir", tmp_path, "--num_epochs", 2,
                 *TINY, launcher=["--cpu"])
    assert_ran(result)
    assert_trained(read_metrics(tmp_path), epochs=2, images=200, processes=1)
    assert_logged_per_epoch(result, "cv_example", epochs=2)
    assert not {"imports_s", "first_step_s", "started_at"} & read_metrics(tmp_path).keys()
    assert read_metrics(tmp_path)["skipped_images"] == []
    assert "eval accuracy" in result.stdout and "0 unreadable image(s) skipped" in result.stdout


def test_on_a_terminal_the_bar_shows_images_per_second_and_the_loss(tmp_path):
    """stderr is a pseudo-terminal: tqdm draws the bar (every update: TQDM_MININTERVAL=0)."""
    images = tmp_path / "images"
    demo.write_demo_images(images, count=20, size=16, classes=2)
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # rows, columns
    process = subprocess.Popen(command("cv_example", "--data_dir", images, "--output_dir",
                                       tmp_path / "out", "--num_epochs", 1, *TINY),
                               stdout=subprocess.PIPE, stderr=terminal, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1",
                                    "TQDM_MININTERVAL": "0"})
    os.close(terminal)
    screen = bytearray()

    def read_screen():
        while True:
            try:
                piece = os.read(controller, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not piece:
                return
            screen.extend(piece)

    reader = threading.Thread(target=read_screen, daemon=True)
    reader.start()
    stdout, _ = process.communicate(timeout=300)
    reader.join(timeout=30)
    os.close(controller)
    assert process.returncode == 0, screen.decode(errors="replace")[-3000:]
    bar = screen.decode(errors="replace")
    assert re.search(r"epoch 1/1: +\d+%\|.*\| 16/16 \[.*img/s, loss=\d+\.\d{3}\]", bar), bar
    assert len(epoch_lines("cv_example", stdout)) == 1


def test_cv_example_two_processes_with_workers_on_a_folder_of_pngs(tmp_path):
    images = tmp_path / "images"
    demo.write_demo_images(images, count=60, size=24, classes=3, layout="folders",
                           file_format="png")
    result = run("cv_example", "--data_dir", images, "--output_dir", tmp_path / "out",
                 "--num_epochs", 1, "--num_workers", 1, *TINY,
                 launcher=["--cpu", "--num_processes", "2"])
    assert_two_ranks_ran(result)
    assert_trained(read_metrics(tmp_path / "out"), epochs=1, images=60, processes=2)


@pytest.mark.parametrize("damage, workers", [("jpeg cut short", 1), ("png not zlib", 0)])
def test_cv_example_skips_and_counts_a_corrupt_image(damage, workers, tmp_path):
    """torchvision's reader and then Pillow reject the damaged file (in a worker or in line); the
    run goes on without it."""
    images = tmp_path / "images"
    paths = demo.write_demo_images(images, count=20, size=24, classes=2)
    if damage == "jpeg cut short":
        paths[0].write_bytes(paths[0].read_bytes()[:200])  # a JPEG header, then the data stops
    else:
        paths[0].unlink()
        paths[0] = paths[0].with_suffix(".png")
        paths[0].write_bytes(with_idat(png_with_rows_missing(rows=24), lambda b: (
            b"\x78\x9c" + bytes(range(200)), True)))
    result = run("cv_example", "--data_dir", images, "--output_dir", tmp_path / "out",
                 "--num_workers", workers, "--num_epochs", 1, *TINY)
    assert_ran(result)
    assert read_metrics(tmp_path / "out")["skipped_images"] == [str(paths[0])]
    assert "1 unreadable image(s) skipped" in result.stdout


# ---------------------------------------------------------------- complete_cv_example


@pytest.fixture(scope="module")
def uninterrupted(pets, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("uninterrupted")
    assert_ran(run("complete_cv_example", "--data_dir", pets, "--output_dir", output,
                   "--num_epochs", 2, "--num_workers", 2, *TINY))
    return output


def test_complete_example_skips_a_damaged_png_and_exits(tmp_path):
    """Two workers, which ignore SIGTERM: a damaged PNG must neither end one nor hold the exit."""
    images = tmp_path / "images"
    paths = demo.write_demo_images(images, count=20, size=16, classes=2, file_format="png")
    paths[0].write_bytes(with_idat(png_with_rows_missing(rows=64), lambda b: (
        b"\x78\x9c" + bytes(range(200)), True)))
    result = finish(start("complete_cv_example", "--data_dir", images, "--output_dir",
                          tmp_path / "out", "--num_epochs", 1, "--num_workers", 2, *TINY))
    assert_ran(result)
    assert read_metrics(tmp_path / "out")["skipped_images"] == [str(paths[0])]
    assert "1 unreadable image(s) skipped" in result.stdout
    assert_logged_per_epoch(result, "complete_cv_example", epochs=1)


def test_a_worker_killed_mid_training_fails_the_run_without_hanging_its_exit(pets, tmp_path):
    """At exit, multiprocessing would wait for ever for the other worker (it ignores SIGTERM)."""
    process = start("complete_cv_example", "--data_dir", pets, "--output_dir", tmp_path,
                    "--num_epochs", 2, "--num_workers", 2, "--checkpointing_steps", 3, *TINY)
    wait_for(tmp_path / "checkpoints" / "step_00000003", process)
    workers = psutil.Process(process.pid).children()
    assert len(workers) == 2
    workers[0].kill()
    try:
        process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("the run did not exit after losing a DataLoader worker") from None
    assert process.returncode == 1
    assert not any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
                   for worker in workers)


def test_complete_example_writes_weights_and_metrics(uninterrupted):
    metrics = read_metrics(uninterrupted)
    assert_trained(metrics, epochs=2, images=200, processes=1)
    assert (metrics["global_step"], metrics["skipped_images"]) == (80, [])
    weights = load_file(uninterrupted / "model" / "model.safetensors")
    untrained = torchvision.models.get_model("squeezenet1_1", num_classes=10).state_dict()
    assert weights.keys() == untrained.keys()
    assert not all(torch.equal(weights[k], untrained[k]) for k in weights if k.endswith("weight"))


def test_resume_after_ctrl_c_ends_exactly_like_the_uninterrupted_run(pets, uninterrupted,
                                                                     tmp_path):
    """Ctrl-C reaches the whole process group, DataLoader workers too: they leave it to the
    training process, which finishes the step and saves."""
    common = ["--data_dir", pets, "--output_dir", tmp_path, "--num_epochs", 2,
              "--num_workers", 2, *TINY]
    process = start("complete_cv_example", *common, "--checkpointing_steps", 3)
    wait_for(tmp_path / "checkpoints" / "step_00000003", process)
    os.killpg(process.pid, signal.SIGINT)
    stopped = finish(process)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and not (tmp_path / "metrics.json").exists()
    assert 3 <= latest_step(tmp_path) < 80  # mid-training
    assert f"stopped at step {latest_step(tmp_path)}" in stopped.stdout
    assert not list((tmp_path / "checkpoints").glob("*.partial"))

    resumed = run("complete_cv_example", *common, "--resume_from_checkpoint", "latest")
    assert_ran(resumed)
    assert f"step {latest_step(tmp_path)}" in resumed.stdout
    expected, got = read_metrics(uninterrupted), read_metrics(tmp_path)
    assert got["global_step"] == expected["global_step"]
    assert got["eval_accuracy_per_epoch"] == expected["eval_accuracy_per_epoch"]
    reference = load_file(uninterrupted / "model" / "model.safetensors")
    weights = load_file(tmp_path / "model" / "model.safetensors")
    assert [name for name in reference if not torch.equal(reference[name], weights[name])] == []


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 64 MiB tmpfs of its own (it needs root), unmounted at the end."""
    with mounted_small_disk(tmp_path / "disk", "64m") as folder:
        yield folder


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_one(small_disk,
                                                                              tmp_path):
    """The save writes into step_N.partial, removed when it fails; the rename makes it whole."""
    images = tmp_path / "images"
    demo.write_demo_images(images, count=20, size=16, classes=2)
    out = small_disk / "out"
    common = ["--data_dir", images, "--output_dir", out, "--checkpointing_steps", "epoch", *TINY]
    assert_ran(run("complete_cv_example", *common, "--num_epochs", 1))
    checkpoint = latest_checkpoint(out)
    saved = {path.name: path.read_bytes() for path in checkpoint.iterdir()}
    size = sum(path.stat().st_size for path in checkpoint.iterdir())
    room = shutil.disk_usage(small_disk).used + size // 2  # half a checkpoint left free
    subprocess.run(["mount", "-o", f"remount,size={room}", str(small_disk)], check=True)

    result = run("complete_cv_example", *common, "--num_epochs", 2,
                 "--resume_from_checkpoint", "latest")
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.fullmatch(
        rf"complete_cv_example: error: cannot save {re.escape(str(out / 'checkpoints'))}/step_"
        r"\d{8} \([\d.]+ MiB free there: .+\); make room or choose another --output_dir; the "
        r"checkpoints before it are whole", errors[0]), errors[0]
    assert list((out / "checkpoints").iterdir()) == [checkpoint]  # no .partial left
    assert {path.name: path.read_bytes() for path in checkpoint.iterdir()} == saved


def training_process(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    """The process of `rank` under the launcher (torchrun's child, not a DataLoader worker)."""
    for process in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if (process.environ().get("RANK") == str(rank)  # a worker's parent has its RANK too
                    and process.parent().environ().get("RANK") != str(rank)):
                return process
        except psutil.Error:  # a worker that just ended
            continue
    raise AssertionError(f"no training process of rank {rank}")


def test_sigterm_to_one_of_two_processes_stops_both_then_they_resume(tmp_path):
    """Only rank 1 gets the signal: rank 0 stops at the same step only if they agree on it
    (without agreeing, rank 0 trains on and the two wait for each other for ever)."""
    images = tmp_path / "images"
    paths = demo.write_demo_images(images, count=80, size=24, classes=4)
    paths[0].write_bytes(paths[0].read_bytes()[:200])  # truncated
    paths[1].write_text("not an image at all")
    common = ["--data_dir", images, "--output_dir", tmp_path / "out", "--num_epochs", 2,
              "--num_workers", 1, "--resume_from_checkpoint", "latest", *TINY]
    two_processes = ["--cpu", "--num_processes", "2"]
    process = start("complete_cv_example", *common, "--checkpointing_steps", 3,
                    launcher=two_processes)
    wait_for(tmp_path / "out" / "checkpoints" / "step_00000003", process)
    training_process(process, rank=1).send_signal(signal.SIGTERM)
    stopped = finish(process)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "no checkpoint in" in stopped.stdout  # `latest` before any checkpoint: a fresh start
    assert re.search(r"mpslaunch: rank \d stopped first: it exited with code 143", stopped.stderr)
    assert "Traceback" not in stopped.stderr and "failed first" not in stopped.stderr
    step = latest_step(tmp_path / "out")
    assert f"stopped at step {step}" in stopped.stdout
    checkpoint = latest_checkpoint(tmp_path / "out")
    assert {p.name for p in checkpoint.glob("random_states_*")} == {"random_states_0.pkl",
                                                                     "random_states_1.pkl"}
    resumed = run("complete_cv_example", *common, launcher=two_processes)
    assert_two_ranks_ran(resumed)
    metrics = read_metrics(tmp_path / "out")
    assert_trained(metrics, epochs=2, images=80, processes=2)
    assert metrics["global_step"] == 2 * (64 // 4 // 2)
    assert sorted(metrics["skipped_images"]) == sorted(map(str, paths[:2]))
    assert "2 unreadable image(s) skipped" in resumed.stdout


# ---------------------------------------------------------------- decoding PNG files


ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2))


def interlaced_png(width: int, height: int, drop_rows: int = 0) -> bytes:
    """An Adam7-interlaced RGB PNG (Pillow and torchvision write none), less its last rows."""
    rows = [b"\0" + bytes(v for x in range(x0, width, dx) for v in (x * 9 % 256, y * 9 % 256, 99))
            for x0, y0, dx, dy in ADAM7 if x0 < width for y in range(y0, height, dy)]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header)
            + png_chunk(b"IDAT", zlib.compress(b"".join(rows[:len(rows) - drop_rows])))
            + png_chunk(b"IEND", b""))


def pillow_png(mode: str, **options) -> bytes:
    pixels = torch.randint(0, 256, (11, 9, 3), dtype=torch.uint8).numpy()
    picture = Image.fromarray(pixels[..., 0].astype("uint16") * 257) if mode == "I;16" \
        else Image.fromarray(pixels).convert(mode, **options)
    buffer = io.BytesIO()
    picture.save(buffer, "PNG", **({"bits": 2} if options else {}))
    return buffer.getvalue()


WHOLE_PNGS = {
    "rgb (torchvision)": lambda: encode_png(torch.zeros(3, 5, 7, dtype=torch.uint8)).numpy(),
    "grey (torchvision)": lambda: encode_png(torch.ones(1, 5, 7, dtype=torch.uint8)).numpy(),
    "1-bit": lambda: pillow_png("1"), "palette": lambda: pillow_png("P"),
    "2-bit palette": lambda: pillow_png("P", palette=Image.Palette.ADAPTIVE, colors=4),
    "grey and alpha": lambda: pillow_png("LA"), "rgba": lambda: pillow_png("RGBA"),
    "16-bit grey": lambda: pillow_png("I;16"), "interlaced": lambda: interlaced_png(13, 7),
}


def test_the_content_picks_the_reader_not_the_name(tmp_path):
    """A PNG named .jpg (torchvision's JPEG reader refuses it, Pillow reads it) and a JPEG named
    .png both decode."""
    jpeg, png = demo.write_demo_images(tmp_path / "j", count=1, size=12)[0], tmp_path / "a.jpg"
    png.write_bytes(bytes(encode_png(torch.full((3, 5, 7), 200, dtype=torch.uint8)).numpy()))
    jpeg = jpeg.rename(tmp_path / "b.png")
    images = cv_example.ImageFiles([(png, 0), (jpeg, 1)], image_size=4, train=False)
    assert [(image.shape, label) for image, label in (images[0], images[1])] == [((3, 4, 4), 0),
                                                                                ((3, 4, 4), 1)]
    assert images[0][0].eq(200).all() and not images.unreadable.any()


@pytest.mark.parametrize("kind", WHOLE_PNGS)
def test_whole_pngs_of_every_kind_decode(kind, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(bytes(WHOLE_PNGS[kind]()))
    images = cv_example.ImageFiles([(path, 1)], image_size=4, train=True)
    image, label = images[0]
    assert (image.dtype, image.shape, label) == (torch.uint8, (3, 4, 4), 1)
    assert not images.unreadable.any()


def with_idat(png: bytes, transform) -> bytes:
    """The PNG with its IDAT chunk's body transformed, the checksum recomputed (or not)."""
    length = struct.unpack_from(">I", png, 33)[0]  # the chunk after the 8-byte signature + IHDR
    body, rest = png[41:41 + length], png[41 + length + 4:]
    new_body, fix_crc = transform(body)
    chunk = png_chunk(b"IDAT", new_body)
    return png[:33] + (chunk if fix_crc else chunk[:-4] + b"\0\0\0\0") + rest


DAMAGED_PNGS = {  # each one ended the process (SIGSEGV) in torchvision's decoder
    "rows missing": lambda: png_with_rows_missing(),
    "interlaced, rows missing": lambda: interlaced_png(13, 7, drop_rows=2),
    "a wrong checksum": lambda: with_idat(png_with_rows_missing(rows=64), lambda b: (b, False)),
    "a bad row filter": lambda: with_idat(png_with_rows_missing(rows=64), lambda b: (
        zlib.compress(b"\x09" + zlib.decompress(b)[1:]), True)),
    "not zlib data": lambda: with_idat(png_with_rows_missing(rows=64), lambda b: (
        b"\x78\x9c" + bytes(range(200)), True)),
}


@pytest.mark.parametrize("example", ["cv_example", "complete_cv_example"])
def test_damaged_pngs_never_end_the_process(example, tmp_path):
    """In a process of its own, so that a decoder that crashes fails the test instead of ending
    pytest: each damaged PNG comes back as a picture (what Pillow reads of it) or as skipped."""
    paths = [tmp_path / f"{number}.png" for number in range(len(DAMAGED_PNGS))]
    for path, make in zip(paths, DAMAGED_PNGS.values()):
        path.write_bytes(make())
    code = ("import importlib.util, pathlib, sys\n"
            "spec = importlib.util.spec_from_file_location('example', sys.argv[1])\n"
            "example = importlib.util.module_from_spec(spec); spec.loader.exec_module(example)\n"
            "paths = [(pathlib.Path(path), 1) for path in sys.argv[2:]]\n"
            "images = example.ImageFiles(paths, image_size=8, train=True)\n"
            "for index in range(len(paths)):\n"
            "    image, label = images[index]\n"
            "    print(tuple(image.shape), label, bool(images.unreadable[index]))\n")
    result = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / f"{example}.py"),
                             *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = dict(zip(DAMAGED_PNGS, result.stdout.splitlines()))
    assert set(outcomes.values()) <= {"(3, 8, 8) 1 False", "(3, 8, 8) -100 True"}, outcomes
    assert outcomes["not zlib data"] == outcomes["a bad row filter"] == "(3, 8, 8) -100 True"


# ---------------------------------------------------------------- bad input


def write_images(folder: Path, names: list[str]) -> Path:
    paths = demo.write_demo_images(folder / "_src", count=len(names), size=16)
    for path, name in zip(paths, names):
        path.rename(folder / name)
    (folder / "_src").rmdir()
    return folder


def two_images(tmp: Path) -> list:
    return ["--data_dir", write_images(tmp / "d", ["a_1.jpg", "b_1.jpg"])]


EXPECTED = "it needs Label_Name_123.jpg files or one sub-folder of .jpg/.png files per class"
BAD_INPUTS = {
    "missing data_dir": (lambda tmp: ["--data_dir", tmp / "nowhere"],
                         f"nowhere: no such folder; {EXPECTED}"),
    "data_dir is a file": (lambda tmp: ["--data_dir", write_images(tmp / "d", ["a_1.jpg"])
                                        / "a_1.jpg"], "a_1.jpg: no such folder"),
    "empty data_dir": (lambda tmp: ["--data_dir", (tmp / "e").mkdir() or tmp / "e"],
                       f"e: images of 0 class(es); {EXPECTED}, two classes or more (a demo set: "
                       "python examples/make_demo_images.py"),
    "no file matches": (lambda tmp: ["--data_dir", write_images(tmp / "d", ["cat.jpg", "x.png"])],
                        f"images of 0 class(es); {EXPECTED}"),
    "one class": (lambda tmp: ["--data_dir", write_images(tmp / "d", ["cat_1.jpg", "cat_2.PNG"])],
                  "images of 1 class(es)"),
    "image_size 0": (lambda tmp: [*two_images(tmp), "--image_size", "0"], "--image_size must"),
    "batch_size -4": (lambda tmp: [*two_images(tmp), "--batch_size", "-4"], "--batch_size must"),
    "lr nan": (lambda tmp: [*two_images(tmp), "--lr", "nan"], "--lr must be more than 0"),
    "num_workers -1": (lambda tmp: [*two_images(tmp), "--num_workers", "-1"], "0 or more"),
    "not a number": (lambda tmp: [*two_images(tmp), "--num_epochs", "two"], "invalid int value"),
    "unknown model": (lambda tmp: [*two_images(tmp), "--model", "resnet_9000"],
                      "unknown --model 'resnet_9000'"),
    "batch too large": (lambda tmp: [*two_images(tmp), "--batch_size", "2"],
                        "--batch_size 2 x 1 process(es) is more than the 1 training images"),
}
COMPLETE_BAD_INPUTS = {
    "missing checkpoint": (lambda tmp: [*two_images(tmp), "--batch_size", "1",
                                        "--resume_from_checkpoint", tmp / "step_9"],
                           "no such checkpoint folder"),
    "checkpointing_steps": (lambda tmp: [*two_images(tmp), "--checkpointing_steps", "often"],
                            "--checkpointing_steps is epoch or a number of steps, not 'often'"),
}


@pytest.mark.parametrize("example, case", [("cv_example", case) for case in BAD_INPUTS]
                         + [("complete_cv_example", case) for case in COMPLETE_BAD_INPUTS]
                         + [("complete_cv_example", case) for case in ("one class",
                                                                       "missing data_dir")])
def test_bad_input_is_one_line_and_exit_code_2(example, case, tmp_path, capsys):
    make_args, expected = {**BAD_INPUTS, **COMPLETE_BAD_INPUTS}[case]
    module = cv_example if example == "cv_example" else complete
    assert module.main([str(arg) for arg in make_args(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{example}: error: ") and err.count("\n") == 1, err
    assert expected in err


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        complete.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: resnet18)", "(default: 64)", "(default: 224)",
                    "(default: outputs/complete_cv_example)", "--resume_from_checkpoint"):
        assert default in text
