"""Make a small demo image set for cv_example.py, on the spot, with no network.

    python examples/make_demo_images.py images                 # 1,797 JPEGs, Pet-style names
    python examples/make_demo_images.py images --layout folders  # one sub-folder per class
    python examples/make_demo_images.py images --count 300 --size 32 --format png
    python examples/make_demo_images.py images --classes 2     # only zeros and ones

The pictures are real: scikit-learn's "digits" data set (UCI ML hand-written digits: 1,797
8x8 grey-scale scans of digits written by 43 people), which ships inside the scikit-learn
package, so nothing is downloaded. Each scan is scaled up (bilinear, so strokes stay smooth)
and written as an RGB image file named the way the Oxford-IIIT Pet set names its files:
`seven_0042.jpg` is a "seven" (the label is everything before the last `_number`). With
`--layout folders` the same files go into `seven/0042.jpg` (torchvision's ImageFolder layout).

Which images are written is fixed by `--seed`, so the same command always makes the same set.
Needs scikit-learn (`pip install scikit-learn`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torchvision.io import encode_jpeg, encode_png
from torchvision.transforms.v2 import functional as F

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PROG = "make_demo_images"


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 digit scans as uint8 (N, 8, 8) in 0..255, and their labels (N,)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        sys.exit(f"{PROG}: error: scikit-learn is not installed; it ships the digits data set "
                 "used for the demo images: pip install scikit-learn")
    digits = sklearn_digits()
    # The scans hold 17 grey levels (0..16).
    pixels = torch.from_numpy(digits.images * (255.0 / 16.0)).round().to(torch.uint8)
    return pixels, torch.from_numpy(digits.target).long()


def digit_picture(scan: torch.Tensor, size: int) -> torch.Tensor:
    """One 8x8 scan as a (3, size, size) uint8 RGB picture."""
    grey = F.resize(scan[None], [size, size], interpolation=F.InterpolationMode.BILINEAR,
                    antialias=False)
    return grey.expand(3, -1, -1).contiguous()


def encode(picture: torch.Tensor, file_format: str) -> bytes:
    data = encode_png(picture) if file_format == "png" else encode_jpeg(picture, quality=95)
    return data.numpy().tobytes()


def file_path(out_dir: Path, label: str, number: int, layout: str, suffix: str) -> Path:
    if layout == "folders":
        return out_dir / label / f"{number:04d}.{suffix}"
    return out_dir / f"{label}_{number:04d}.{suffix}"


def write_demo_images(out_dir: str | Path, *, count: int | None = None, size: int = 64,
                      classes: int = 10, layout: str = "pet", file_format: str = "jpg",
                      seed: int = 0) -> list[Path]:
    """Write `count` pictures of the digits 0..classes-1 (all of them when count is None)
    under out_dir; returns their paths."""
    out_dir = Path(out_dir)
    scans, labels = load_digits()
    wanted = labels < classes
    scans, labels, numbers = scans[wanted], labels[wanted], wanted.nonzero().flatten()
    order = torch.randperm(len(scans), generator=torch.Generator().manual_seed(seed))
    chosen = order if count is None else order[:count]
    written = []
    for row in sorted(chosen.tolist()):
        label = DIGIT_NAMES[labels[row]]
        path = file_path(out_dir, label, int(numbers[row]), layout, file_format)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode(digit_picture(scans[row], size), file_format))
        written.append(path)
    return written


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to write the images into (created if needed)")
    parser.add_argument("--count", type=positive_int, default=None,
                        help="how many images (default: all 1,797)")
    parser.add_argument("--size", type=positive_int, default=64, help="side in pixels (default 64)")
    parser.add_argument("--classes", type=int, choices=range(2, 11), default=10, metavar="2..10",
                        help="use the digits 0 .. classes-1 only (default: all ten)")
    parser.add_argument("--layout", choices=("pet", "folders"), default="pet",
                        help="pet: label_123.jpg in one folder; folders: label/123.jpg")
    parser.add_argument("--format", dest="file_format", choices=("jpg", "png"), default="jpg")
    parser.add_argument("--seed", type=int, default=0, help="which images --count picks")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    paths = write_demo_images(args.out_dir, count=args.count, size=args.size,
                              classes=args.classes, layout=args.layout,
                              file_format=args.file_format, seed=args.seed)
    print(f"wrote {len(paths)} {args.size}x{args.size} digit images to {args.out_dir}")


if __name__ == "__main__":
    main()
