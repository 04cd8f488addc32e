"""examples/cv_example.py end to end on the CPU: real JPEG/PNG files (scikit-learn's hand-written
digits, written by examples/make_demo_images.py), real torch and Accelerate, a small torchvision
model (squeezenet1_1, which has dropout, so resuming must restore the random state too) at tiny
image sizes. Runs go through `python cv_example.py` and through `mpslaunch launch`.

Each run uses one compute thread (OMP_NUM_THREADS=1): on a shared 2-core machine, two OpenMP
threads plus DataLoader workers oversubscribe the cores and a run gets tens of times slower.
Nothing here measures speed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# torchvision 0.29 deprecates its image codecs in favour of TorchCodec; they still work.
pytestmark = [pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cv_example.py"
sys.path.insert(0, str(EXAMPLE.parent))  # for examples/cv_classifier, which cv_example.py runs

from cv_classifier.checkpoints import latest_checkpoint, write_replacing
from cv_classifier.cli import InputError
from cv_classifier.data import (UNREADABLE, EpochShuffle, ImageFiles, collate_decoded, seeded_rng,
                              train_transform)
from cv_classifier.gpu_decode import (AUTO_GPU_DECODE_BYTES, DecodedImageCache, JpegBatchDecoder,
                                      augmentation_params, choose_decode, collate_encoded,
                                      jpeg_size, mean_file_size)
from cv_classifier.images import check_batch_fits, pet_layout, split_train_eval
from cv_classifier.model import build_model, replace_classifier

TINY = ["--model", "squeezenet1_1", "--image_size", "24", "--batch_size", "4", "--cpu"]


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = load_module("make_demo_images")
cv_example = load_module("cv_example")


def child_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run_example(*args, launcher: list[str] | None = None,
                timeout: float = 180) -> subprocess.CompletedProcess:
    command = ([sys.executable, "-m", "mpslaunch", "launch", *launcher] if launcher is not None
               else [sys.executable]) + [str(EXAMPLE), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=child_env())


def read_metrics(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


def assert_ran(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def assert_trained(metrics: dict, *, epochs: int, images: int, processes: int) -> None:
    assert metrics["epochs"] == epochs
    assert len(metrics["eval_accuracy_per_epoch"]) == epochs
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert metrics["eval_accuracy"] == metrics["eval_accuracy_per_epoch"][-1]
    assert metrics["train_images"] + metrics["eval_images"] == images
    assert metrics["eval_images"] == round(images * 0.2)
    assert metrics["train_images_per_second"] > 0
    assert metrics["device"] == "cpu"
    assert metrics["mixed_precision"] == "no"
    assert metrics["num_processes"] == processes
    steps_per_epoch = metrics["train_images"] // metrics["batch_size"] // processes
    assert metrics["global_step"] == epochs * steps_per_epoch


@pytest.fixture(scope="module")
def pet_images(tmp_path_factory) -> Path:
    """200 digits as Label_123 files, with every suffix spelling the issue names."""
    folder = tmp_path_factory.mktemp("pets")
    paths = demo.write_demo_images(folder, count=200, size=24, seed=1)
    for path, suffix in zip(paths[::4], [".JPG", ".jpeg", ".JPEG"] * 100):
        path.rename(path.with_suffix(suffix))
    return folder


@pytest.fixture(scope="module")
def uninterrupted_run(pet_images, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("uninterrupted")
    result = run_example("--data_dir", pet_images, "--output_dir", output, "--num_epochs", 2,
                         "--num_workers", 2, *TINY)
    assert_ran(result)
    return output


# ---------------------------------------------------------------- training


def test_trains_on_pet_named_files_and_writes_metrics(uninterrupted_run):
    metrics = read_metrics(uninterrupted_run)
    assert_trained(metrics, epochs=2, images=200, processes=1)
    assert metrics["model"] == "squeezenet1_1" and metrics["skipped_images"] == 0
    assert metrics["cuda_graph"] is False  # CPU
    assert len(metrics["data_wait_s_per_epoch"]) == 2
    weights = load_file(uninterrupted_run / "model.safetensors")
    untrained = build_model("squeezenet1_1", 10, pretrained=False).state_dict()
    assert weights.keys() == untrained.keys()
    assert not all(torch.equal(weights[k], untrained[k]) for k in weights if k.endswith("weight"))


def test_folder_layout_of_pngs_through_the_launcher(tmp_path):
    images = tmp_path / "images"
    demo.write_demo_images(images, count=60, size=24, classes=3, layout="folders",
                           file_format="png")
    result = run_example("--data_dir", images, "--output_dir", tmp_path / "out", "--num_epochs", 1,
                         "--resume_from_checkpoint", "latest", *TINY, launcher=["--cpu"])
    assert_ran(result)
    assert_trained(read_metrics(tmp_path / "out"), epochs=1, images=60, processes=1)
    assert "no checkpoint in" in result.stderr  # `latest` before any checkpoint: a fresh start


def test_two_cpu_processes_through_the_launcher(tmp_path):
    images = tmp_path / "images"
    demo.write_demo_images(images, count=50, size=24, classes=3)
    result = run_example("--data_dir", images, "--output_dir", tmp_path / "out", "--num_epochs", 2,
                         "--checkpointing_steps", "epoch", *TINY,
                         launcher=["--cpu", "--num_processes", "2"])
    assert_ran(result)
    assert_trained(read_metrics(tmp_path / "out"), epochs=2, images=50, processes=2)
    # 40 training images, 4 per batch, 2 processes: 5 steps per epoch, a checkpoint after each;
    # every process saved its own random states.
    checkpoints = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert checkpoints == ["step_00000005", "step_00000010"]
    last = tmp_path / "out" / "checkpoints" / "step_00000010"
    assert (last / "random_states_0.pkl").is_file() and (last / "random_states_1.pkl").is_file()


def training_process(launcher: subprocess.Popen, rank: int):
    """The process of `rank` under the launcher (torchrun's child, not a DataLoader worker)."""
    import psutil
    for process in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if (process.environ().get("RANK") == str(rank)  # a worker's parent has its RANK too
                    and process.parent().environ().get("RANK") != str(rank)):
                return process
        except psutil.Error:  # a worker that just ended
            continue
    raise AssertionError(f"no training process of rank {rank}")


def test_sigterm_to_one_of_two_processes_stops_both_at_one_step_with_a_checkpoint(tmp_path):
    """Only rank 1 gets the signal: rank 0 stops at the same step only if they agree on it
    (without agreeing, rank 0 trains on and the two wait for each other for ever)."""
    images = tmp_path / "images"
    demo.write_demo_images(images, count=200, size=24, classes=4)
    output = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "mpslaunch", "launch", "--cpu", "--num_processes", "2",
         str(EXAMPLE), "--data_dir", str(images), "--output_dir", str(output), "--num_epochs", "4",
         "--num_workers", "1", "--checkpointing_steps", "3", *TINY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=child_env())
    try:
        wait_for(output / "checkpoints" / "step_00000003", process)
        training_process(process, rank=1).send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr
    # the launcher's summary: a clean stop, not a failure
    assert re.search(r"mpslaunch: rank \d stopped first: it exited with code 143", stderr)
    assert "failed first" not in stderr
    assert not (output / "metrics.json").exists()
    last = latest_checkpoint(output)
    stopped_at = int(last.name.split("_")[1])
    assert f"stopped at step {stopped_at}" in stdout
    assert (last / "random_states_0.pkl").is_file() and (last / "random_states_1.pkl").is_file()
    assert not list((output / "checkpoints").glob("*.partial"))


def test_unreadable_and_truncated_images_are_skipped_with_a_warning(tmp_path):
    images = tmp_path / "images"
    paths = demo.write_demo_images(images, count=60, size=24, classes=3)
    truncated = paths[:3]
    for path in truncated:  # a real JPEG header, then the data stops
        path.write_bytes(path.read_bytes()[:200])
    (images / "three_9999.jpg").write_text("not an image at all")
    result = run_example("--data_dir", images, "--output_dir", tmp_path / "out", "--num_epochs", 1,
                         "--num_workers", 2, *TINY)
    assert_ran(result)
    assert "1 file(s) that are not JPEG or PNG images: " in result.stderr
    assert "three_9999.jpg" in result.stderr
    assert "could not be decoded (corrupt or truncated)" in result.stderr
    named = {path.name for path in truncated if path.name in result.stderr}
    assert named == {path.name for path in truncated}
    metrics = read_metrics(tmp_path / "out")
    assert metrics["skipped_images"] == 4
    assert metrics["train_images"] + metrics["eval_images"] == 60  # truncated ones still listed


# ---------------------------------------------------------------- interrupt and resume


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "finished before it could be interrupted"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def interrupt_mid_training(pet_images: Path, output: Path, send) -> subprocess.CompletedProcess:
    """Start the uninterrupted run's twin, signal it once step 3's checkpoint exists."""
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--data_dir", str(pet_images), "--output_dir", str(output),
         "--num_epochs", "2", "--num_workers", "2", "--checkpointing_steps", "3", *TINY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=child_env())
    wait_for(output / "checkpoints" / "step_00000003", process)
    send(process)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_resume_after_sigterm_ends_exactly_like_the_uninterrupted_run(
        pet_images, uninterrupted_run, tmp_path):
    stopped = interrupt_mid_training(pet_images, tmp_path,
                                     lambda process: process.send_signal(signal.SIGTERM))
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert not (tmp_path / "metrics.json").exists()
    last = latest_checkpoint(tmp_path)
    stopped_at = int(last.name.split("_")[1])
    total_steps = read_metrics(uninterrupted_run)["global_step"]
    assert 3 <= stopped_at < total_steps  # really mid-training
    assert f"stopped at step {stopped_at}" in stopped.stdout

    resumed = run_example("--data_dir", pet_images, "--output_dir", tmp_path, "--num_epochs", 2,
                          "--num_workers", 2, "--resume_from_checkpoint", "latest", *TINY)
    assert_ran(resumed)
    assert f"step {stopped_at}" in resumed.stdout
    expected, got = read_metrics(uninterrupted_run), read_metrics(tmp_path)
    assert got["global_step"] == expected["global_step"]
    assert got["eval_accuracy_per_epoch"] == expected["eval_accuracy_per_epoch"]
    reference = load_file(uninterrupted_run / "model.safetensors")
    weights = load_file(tmp_path / "model.safetensors")
    different = [name for name in reference if not torch.equal(reference[name], weights[name])]
    assert different == []


def test_ctrl_c_to_the_whole_process_group_saves_a_checkpoint(pet_images, tmp_path):
    """A terminal sends SIGINT to the DataLoader workers too; they must leave it to the trainer."""
    stopped = interrupt_mid_training(
        pet_images, tmp_path, lambda process: os.killpg(process.pid, signal.SIGINT))
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    last = latest_checkpoint(tmp_path)
    assert (last / "model.safetensors").is_file() and (last / "random_states_0.pkl").is_file()
    assert not list((tmp_path / "checkpoints").glob("*.partial"))


# ---------------------------------------------------------------- bad input


def write_images(folder: Path, names: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    paths = demo.write_demo_images(folder / "_src", count=len(names), size=16)
    for path, name in zip(paths, names):
        path.rename(folder / name)
    (folder / "_src").rmdir()
    return folder


BAD_INPUTS = {
    "missing data_dir": (lambda tmp: ["--data_dir", tmp / "nowhere"], "does not exist"),
    "empty data_dir": (lambda tmp: ["--data_dir", (tmp / "empty").mkdir() or tmp / "empty"],
                       "is empty"),
    "no image matches": (
        lambda tmp: ["--data_dir", write_images(tmp / "d", ["cat.jpg", "dog.png", "notes.txt"])],
        "match either layout"),
    "single class": (
        lambda tmp: ["--data_dir", write_images(tmp / "d", ["cat_1.jpg", "cat_2.JPG", "cat_3.png"])],
        "only the class 'cat'"),
    "image_size 0": (lambda tmp: ["--data_dir", tmp, "--image_size", "0"], "--image_size"),
    "negative batch_size": (lambda tmp: ["--data_dir", tmp, "--batch_size", "-4"], "--batch_size"),
    "negative image_cache_gb": (lambda tmp: ["--data_dir", tmp, "--image_cache_gb", "-1"],
                                "--image_cache_gb: must be 0 or more"),
    "image_cache_gb nan": (lambda tmp: ["--data_dir", tmp, "--image_cache_gb", "nan"],
                           "--image_cache_gb: must be 0 or more"),
    "bad checkpointing_steps": (lambda tmp: ["--data_dir", tmp, "--checkpointing_steps", "often"],
                                "'epoch' or a number"),
    "unknown model": (
        lambda tmp: ["--data_dir", write_images(tmp / "d", ["a_1.jpg", "b_1.jpg"]),
                     "--model", "resnet_9000"], "unknown --model 'resnet_9000'"),
    "missing checkpoint": (
        lambda tmp: ["--data_dir", write_images(tmp / "d", ["a_1.jpg", "b_1.jpg"]),
                     "--resume_from_checkpoint", tmp / "no_such_step"], "no such checkpoint"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_code_2(case, tmp_path, capsys):
    make_args, expected = BAD_INPUTS[case]
    assert cv_example.main([str(a) for a in make_args(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("cv_example: error: ") and err.count("\n") == 1, err
    assert expected in err


def test_pretrained_without_cached_weights_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))  # no cached weights
    images = write_images(tmp_path / "d", ["a_1.jpg", "b_1.jpg"])
    assert cv_example.main(["--data_dir", str(images), "--pretrained"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not cached" in err and "weights='DEFAULT'" in err
    assert not (tmp_path / "empty_torch_home" / "hub" / "checkpoints").exists()  # no download


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path):
    result = run_example("--data_dir", tmp_path / "nowhere", "--cpu")
    assert result.returncode == 2
    assert result.stderr.startswith("cv_example: error: --data_dir")
    assert result.stderr.count("\n") == 1


def test_batch_larger_than_the_training_set_is_an_input_error(tmp_path, capsys):
    images = tmp_path / "d"
    demo.write_demo_images(images, count=10, size=16, classes=2)
    assert cv_example.main(["--data_dir", str(images), "--batch_size", "9"]) == 2
    assert capsys.readouterr().err == ("cv_example: error: --batch_size 9 x 1 process(es) is more "
                                       "than the 8 training images; use a smaller --batch_size "
                                       "or more images\n")
    with pytest.raises(InputError, match="x 2 process"):
        check_batch_fits(num_train=8, batch_size=5, processes=2)
    check_batch_fits(num_train=8, batch_size=4, processes=2)


# ---------------------------------------------------------------- pieces


def test_pet_names_label_is_everything_before_the_last_number(tmp_path):
    names = ["american_bulldog_12.jpg", "Abyssinian_3.JPEG", "great_pyrenees_7_100.png",
             "._american_bulldog_13.jpg", "nonumber.jpg", "notes_1.txt"]
    found = pet_layout([tmp_path / name for name in names])
    assert [(p.name, label) for p, label in found] == [
        ("american_bulldog_12.jpg", "american_bulldog"), ("Abyssinian_3.JPEG", "Abyssinian"),
        ("great_pyrenees_7_100.png", "great_pyrenees_7")]


@pytest.mark.parametrize("name, head", [("resnet18", "fc"), ("mobilenet_v3_small", "classifier.3"),
                                        ("vit_b_16", "heads.head")])
def test_pretrained_models_get_a_new_head_for_the_classes(name, head):
    import torchvision
    model = torchvision.models.get_model(name)  # 1000 ImageNet classes, random weights
    replace_classifier(model, 7, name)
    assert model.get_submodule(head).out_features == 7


def test_split_is_80_20_and_fixed_by_the_seed():
    samples = list(range(101))
    train, evals = split_train_eval(samples, seed=7)
    assert len(evals) == 20 and sorted(train + evals) == samples
    assert split_train_eval(samples, seed=7) == (train, evals)
    assert split_train_eval(samples, seed=8) != (train, evals)


def test_augmentation_depends_only_on_seed_epoch_and_image(tmp_path):
    paths = demo.write_demo_images(tmp_path, count=12, size=32)
    dataset = ImageFiles([(p, 0) for p in paths], train_transform(16), 16)
    sampler = EpochShuffle(len(dataset), seed=3)
    sampler.set_epoch(1)
    draws = list(sampler)
    first = [dataset[item][0] for item in draws]
    torch.manual_seed(12345)  # whatever the process RNG holds, the same images come out
    again = [dataset[item][0] for item in reversed(draws)][::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    sampler.set_epoch(2)
    assert list(sampler) != draws


# ---------------------------------------------------------------- --decode gpu, on the CPU
# The GPU path's logic, run with torchvision's CPU JPEG decoder (CI has no GPU): the worker
# side (bytes, size, crop and flip), the batch decoder, and the training loop wired to them.


def test_jpeg_size_reads_the_frame_header(tmp_path):
    from torchvision.io import encode_jpeg, encode_png
    for height, width in [(375, 500), (500, 375), (17, 9), (1, 1)]:
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8)
        assert jpeg_size(encode_jpeg(image).numpy().tobytes()) == (height, width)
    gray = encode_jpeg(torch.zeros(1, 20, 30, dtype=torch.uint8)).numpy().tobytes()
    assert jpeg_size(gray) == (20, 30)
    assert jpeg_size(gray[:40]) is None  # cut before the frame header
    assert jpeg_size(b"\xff\xd8\xff\xe0") is None
    png = encode_png(torch.zeros(3, 4, 4, dtype=torch.uint8)).numpy().tobytes()
    assert jpeg_size(png) is None and jpeg_size(b"") is None


def test_gpu_decode_path_draws_the_cpu_paths_crop_and_flip(tmp_path):
    """augmentation_params gives exactly the crop and flip train_transform draws for a seed."""
    from torchvision.transforms import v2
    size = 20
    transform = train_transform(size)
    flips = set()
    for n, (height, width) in enumerate([(48, 48), (30, 64), (64, 30), (375, 500)] * 6):
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8)
        seed = 1000 + 7919 * n
        with seeded_rng(seed):
            expected = transform(image)
        with seeded_rng(seed):
            (top, left, crop_h, crop_w), flip = augmentation_params(
                transform, height, width)
        got = v2.functional.resized_crop(image, top, left, crop_h, crop_w, [size, size],
                                         antialias=True)
        got = v2.functional.horizontal_flip(got) if flip else got
        assert torch.equal(got, expected), (height, width, seed)
        flips.add(flip)
    assert flips == {True, False}


def test_encoded_batches_decode_close_to_the_cpu_path(tmp_path):
    """Worker side + JpegBatchDecoder (decoding on the CPU here): same images, same order;
    PNGs decoded by the worker as before; a truncated JPEG comes back blank and failed."""
    paths = demo.write_demo_images(tmp_path / "jpg", count=14, size=48, seed=2)
    png = demo.write_demo_images(tmp_path / "png", count=1, size=40, file_format="png")[0]
    truncated = tmp_path / "cut_1.jpg"
    truncated.write_bytes(paths[0].read_bytes()[:300])  # the header survives, the data not
    paths += [png, truncated]
    size = 32
    samples = [(path, i % 3) for i, path in enumerate(paths)]
    cpu = ImageFiles(samples, train_transform(size), size)
    encoded = ImageFiles(samples, train_transform(size), size, encoded=True)
    sampler = EpochShuffle(len(paths), seed=5)
    sampler.set_epoch(2)
    items = list(sampler)
    batch = collate_encoded([encoded[item] for item in items])
    labels, indices = torch.tensor(batch.labels), torch.tensor(batch.indices)
    assert indices.tolist() == [index for index, _ in items]
    assert labels.tolist() == [i % 3 for i, _ in items]
    png_at = [i for i, (index, _) in enumerate(items) if paths[index] == png]
    assert batch.ready_positions == png_at and len(batch.jpeg_positions) == len(paths) - 1
    images, failed = JpegBatchDecoder(torch.device("cpu"), size)(batch)
    assert images.shape == (len(paths), 3, size, size) and images.dtype == torch.uint8
    cut_at = [i for i, (index, _) in enumerate(items) if paths[index] == truncated]
    assert failed == cut_at and not images[cut_at].any()
    reference = torch.stack([cpu[item][0] for item in items])
    assert cpu[items[cut_at[0]]][1] == UNREADABLE  # the CPU path fails it too
    assert torch.equal(images[png_at], reference[png_at])
    difference = (images.float() - reference.float()).abs()
    for position in set(range(len(paths))) - set(cut_at):
        # the same crop and flip; only the resampling filter differs (a flipped or shifted
        # crop of a digit would differ by tens of levels)
        assert difference[position].mean() < 2.0, position
        assert difference[position].max() <= 24, position


# cv_example with --decode gpu's pipeline forced on (decoding on the CPU: CI has no GPU).
FORCED_GPU_PIPELINE = (
    "import importlib.util, sys\n"
    f"spec = importlib.util.spec_from_file_location('cv_example', {str(EXAMPLE)!r})\n"
    "cv = importlib.util.module_from_spec(spec); sys.modules['cv_example'] = cv\n"
    "spec.loader.exec_module(cv)\n"
    # where the Trainer looks it up (cv_classifier.gpu_decode's own stays as it was)
    "import cv_classifier.trainer\n"
    "cv_classifier.trainer.choose_decode = lambda *args: 'gpu'\n"
    "{before_main}"
    "sys.exit(cv.main(sys.argv[1:]))\n")


def run_patched_example(*args, launcher: list[str] | None = None, script_dir: Path | None = None,
                        before_main: str = "") -> subprocess.CompletedProcess:
    """FORCED_GPU_PIPELINE in a child process, as a user runs it (forking workers from pytest's
    process can hang); through `mpslaunch launch LAUNCHER` when given (the script is written
    to script_dir then); before_main: more lines run before main()."""
    script_text = FORCED_GPU_PIPELINE.replace("{before_main}", before_main)
    command = [sys.executable, "-c", script_text]
    if launcher is not None:
        script = script_dir / "cv_example_gpu_pipeline.py"
        script.write_text(script_text)
        command = [sys.executable, "-m", "mpslaunch", "launch", *launcher, str(script)]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True,
                          timeout=180, env=child_env())


# After the first epoch's evaluation, the training files are deleted: what the second epoch
# trains on can only come from the cache.
DELETE_TRAINING_FILES_AFTER_EPOCH_1 = """\
import os
original_evaluate = cv_classifier.trainer.Trainer.evaluate_epoch
def evaluate_then_delete(self, epoch):
    original_evaluate(self, epoch)
    if epoch == 0:
        for path in self.train_set.paths:
            os.remove(path)
cv_classifier.trainer.Trainer.evaluate_epoch = evaluate_then_delete
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_stop_reading_files_the_cache_holds(tmp_path, start_method):
    """The workers see the training process's table of cached images (shared memory, also when
    they are spawned, as on macOS): with every training file gone after the first epoch, the
    second trains on the cache without one unreadable image; without the cache it cannot."""
    set_start_method = ("import multiprocessing\n"
                        f"multiprocessing.set_start_method({start_method!r})\n")
    for cache_gb in ("1", "0"):
        images = tmp_path / f"images_{cache_gb}"
        demo.write_demo_images(images, count=40, size=24, classes=2, seed=3)
        output = tmp_path / f"out_{cache_gb}"
        result = run_patched_example(
            "--data_dir", images, "--output_dir", output, "--num_epochs", 2, "--num_workers", 2,
            "--image_cache_gb", cache_gb, *TINY,
            before_main=set_start_method + DELETE_TRAINING_FILES_AFTER_EPOCH_1)
        assert_ran(result)
        metrics = read_metrics(output)
        if cache_gb == "1":
            assert metrics["skipped_images"] == 0 and "could not be decoded" not in result.stderr
            assert metrics["cached_images"] == metrics["train_images"]
        else:
            assert metrics["skipped_images"] == metrics["train_images"]


def test_training_with_decode_gpu_wiring_skips_bad_files(tmp_path):
    """The training loop with the encoded pipeline and two workers (decoding on the CPU here);
    in a child process, as a user runs it (forking workers from pytest's process can hang)."""
    images = tmp_path / "images"
    paths = demo.write_demo_images(images, count=60, size=24, classes=3)
    for path in paths[:2]:
        path.write_bytes(path.read_bytes()[:200])
    output = tmp_path / "out"
    result = run_patched_example("--data_dir", images, "--output_dir", output,
                                 "--num_epochs", 1, "--num_workers", 2, *TINY)
    assert_ran(result)
    assert "JPEGs decoded on the gpu" in result.stdout
    assert "could not be decoded (corrupt or truncated)" in result.stderr
    metrics = read_metrics(output)
    assert metrics["decode"] == "gpu"
    assert_trained(metrics, epochs=1, images=60, processes=1)
    assert metrics["skipped_images"] == 2


def test_cached_images_are_not_read_again_and_crop_exactly_like_fresh_ones(tmp_path):
    """The second time round, the worker sends no bytes for an image the cache holds (only its
    crop and flip, the same numbers), and the decoder gives the very same pixels from the
    cache; a truncated JPEG (decoded to the wrong size or not at all) is never cached."""
    paths = demo.write_demo_images(tmp_path, count=9, size=40, seed=4)
    truncated = tmp_path / "cut_1.jpg"
    truncated.write_bytes(paths[0].read_bytes()[:300])
    paths.append(truncated)
    size = 24
    samples = [(path, i % 2) for i, path in enumerate(paths)]
    cache = DecodedImageCache(len(paths), budget_bytes=10**9)
    dataset = ImageFiles(samples, train_transform(size), size,
                         encoded=True, cached_sizes=cache.sizes)
    decoder = JpegBatchDecoder(torch.device("cpu"), size, cache)
    items = list(EpochShuffle(len(paths), seed=3))

    def one_batch():
        batch = collate_encoded([dataset[item] for item in items])
        return batch, *decoder(batch)

    first, first_images, first_failed = one_batch()
    assert all(first.sizes) and len(cache.images) == len(paths) - 1
    cut = paths.index(truncated)
    assert cut not in cache.images and cache.sizes[cut].tolist() == [0, 0]
    again, images, failed = one_batch()
    assert [size == 0 for size in again.sizes] == [index != cut for index, _ in items]
    assert again.meta == first.meta  # same crops and flips
    # only the bytes of the one image not cached travel, in the batch's only tensor
    assert again.data.numel() == truncated.stat().st_size < first.data.numel()
    assert [name for name, value in vars(again).items()
            if isinstance(value, torch.Tensor)] == ["data"]
    assert torch.equal(images, first_images) and failed == first_failed
    assert cache.used_bytes == 9 * 3 * 40 * 40


def test_batches_decoded_in_workers_carry_one_tensor(tmp_path):
    """The CPU path's training batch: the images stacked, labels and indices as lists (each
    tensor a worker sends costs the training process a handshake), made tensors on arrival."""
    paths = demo.write_demo_images(tmp_path, count=5, size=20, seed=8)
    dataset = ImageFiles([(path, i % 2) for i, path in enumerate(paths)], train_transform(16), 16)
    items = list(EpochShuffle(len(paths), seed=1))
    images, targets = collate_decoded([dataset[item] for item in items])
    assert images.shape == (5, 3, 16, 16) and not isinstance(targets.labels, torch.Tensor)
    labels, indices = targets.on(torch.device("cpu"))
    assert indices.tolist() == [index for index, _ in items]
    assert labels.tolist() == [index % 2 for index, _ in items]


def test_cache_budget_is_kept(tmp_path):
    cache = DecodedImageCache(5, budget_bytes=2 * 3 * 10 * 10)
    cache.add([3, 1, 4, 0], [torch.zeros(3, 10, 10, dtype=torch.uint8)] * 4)
    assert sorted(cache.images) == [1, 3] and cache.sizes.tolist() == [
        [0, 0], [10, 10], [0, 0], [10, 10], [0, 0]]
    whole = torch.zeros(2, 3, 10, 12, dtype=torch.uint8)
    roomy = DecodedImageCache(1, budget_bytes=10**6)
    roomy.add([0], [whole[1]])  # a view into a batch: copied, so it does not keep the batch alive
    assert roomy.images[0].untyped_storage().nbytes() == 360
    assert roomy.sizes.tolist() == [[10, 12]]


@pytest.mark.parametrize("cache_gb", ["0", "1"])
def test_decode_gpu_training_ends_the_same_with_and_without_the_cache(tmp_path, cache_gb):
    """Two epochs through the encoded pipeline with two workers; with the cache, the second
    epoch reads no file and decodes nothing, and the weights come out bit-identical."""
    images = tmp_path / "images"
    demo.write_demo_images(images, count=50, size=24, classes=3, seed=6)
    reference, output = tmp_path / "reference", tmp_path / "out"
    common = ["--data_dir", images, "--num_epochs", 2, "--num_workers", 2, *TINY]
    assert_ran(run_patched_example(*common, "--output_dir", reference, "--image_cache_gb", "0"))
    assert_ran(run_patched_example(*common, "--output_dir", output, "--image_cache_gb", cache_gb))
    metrics = read_metrics(output)
    assert metrics["cached_images"] == (metrics["train_images"] if cache_gb == "1" else 0)
    expected = load_file(reference / "model.safetensors")
    weights = load_file(output / "model.safetensors")
    assert all(torch.equal(expected[name], weights[name]) for name in expected)


def test_decode_gpu_pipeline_with_the_cache_in_two_processes(tmp_path):
    """Two gloo processes through the launcher, each with its own cache and workers."""
    images = tmp_path / "images"
    demo.write_demo_images(images, count=50, size=24, classes=3, seed=9)
    output = tmp_path / "out"
    result = run_patched_example("--data_dir", images, "--output_dir", output, "--num_epochs", 2,
                                 "--num_workers", 1, "--image_cache_gb", 1, *TINY,
                                 launcher=["--cpu", "--num_processes", "2"], script_dir=tmp_path)
    assert_ran(result)
    metrics = read_metrics(output)
    assert_trained(metrics, epochs=2, images=50, processes=2)
    assert metrics["decode"] == "gpu"
    # rank 0's cache: at least its half of the training images (a new half each epoch)
    assert metrics["train_images"] // 2 <= metrics["cached_images"] <= metrics["train_images"]


def test_auto_decode_is_cpu_off_cuda_and_for_small_images(tmp_path):
    small = demo.write_demo_images(tmp_path, count=4, size=24)
    cpu = torch.device("cpu")
    assert choose_decode("auto", cpu, [str(p) for p in small]) == "cpu"
    assert choose_decode("cpu", cpu, []) == "cpu"
    with pytest.raises(InputError, match="--decode gpu"):
        choose_decode("gpu", cpu, [])
    assert mean_file_size([str(p) for p in small]) < AUTO_GPU_DECODE_BYTES


def test_results_replace_a_planted_symlink_and_follow_the_umask(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    planted = tmp_path / "metrics.json"
    planted.symlink_to(victim)
    old_mask = os.umask(0o027)
    try:
        write_replacing(planted, "{}\n")
    finally:
        os.umask(old_mask)
    assert victim.read_text() == "precious"
    assert not planted.is_symlink() and planted.read_text() == "{}\n"
    assert stat.S_IMODE(planted.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "victim.txt"]


def test_decode_ahead_chains_its_stages_in_order_and_raises_their_errors():
    from cv_classifier.gpu_decode import DecodeAhead
    cpu = torch.device("cpu")
    stages = [lambda batch: batch * 2, lambda doubled: (doubled + 1,)]
    assert list(DecodeAhead(range(50), stages, cpu)) == [(2 * n + 1,) for n in range(50)]

    def fails_at_7(doubled):
        if doubled == 14:
            raise ValueError("batch 7 is broken")
        return (doubled,)

    ahead = iter(DecodeAhead(range(50), [lambda batch: batch * 2, fails_at_7], cpu))
    assert [next(ahead) for _ in range(7)] == [(2 * n,) for n in range(7)]
    with pytest.raises(ValueError, match="batch 7 is broken"):
        next(ahead)


def test_edge_padded_canvas_repeats_each_images_last_row_and_column_to_the_edge():
    """What roi_align crops from: each image at the top left of its slot, padded as
    replicate-padding would (so bilinear samples at an edge see the edge)."""
    from cv_classifier.gpu_decode import edge_padded_canvas
    generator = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (1, 1), (9, 2), (3, 12)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator)
              for h, w in shapes]
    canvas = edge_padded_canvas(images)
    assert canvas.shape == (4, 3, 10, 13) and canvas.dtype == torch.uint8
    for image, slot in zip(images, canvas):
        _, h, w = image.shape
        padded = torch.nn.functional.pad(image[None].float(), (0, 13 - w, 0, 10 - h),
                                         mode="replicate")[0]
        assert torch.equal(slot.float(), padded)


def test_decode_ahead_left_early_stops_its_threads():
    import threading
    from cv_classifier.gpu_decode import DecodeAhead
    ahead = iter(DecodeAhead(range(10**6), [lambda batch: batch, lambda batch: (batch,)],
                             torch.device("cpu")))
    assert next(ahead) == (0,)
    ahead.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("decode-ahead")]


@pytest.mark.parametrize("device, processes, precision, usable", [
    ("cuda", 1, "no", True), ("cuda", 1, "bf16", True), ("cuda", 1, "fp16", False),
    ("cuda", 2, "no", False), ("cpu", 1, "no", False), ("mps", 1, "no", False)])
def test_cuda_graph_only_for_one_cuda_process_without_a_grad_scaler(device, processes,
                                                                     precision, usable):
    from cv_classifier.model import cuda_graph_usable
    assert cuda_graph_usable(device, processes, precision) is usable
