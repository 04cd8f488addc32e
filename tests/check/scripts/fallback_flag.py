"""An example trainer with a --no-cuda switch: CUDA when asked for and present, else the CPU."""
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cuda", action="store_true", default=False, help="train on the CPU")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")

    loader_options = {"batch_size": 16}
    if use_cuda:
        loader_options.update({"num_workers": 2, "pin_memory": True})
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, shuffle=True, **loader_options)
    model = torch.nn.Linear(4, 2).to(device)
    for _ in range(args.epochs):
        for features, labels in loader:
            features, labels = features.to(device), labels.to(device)
            torch.nn.functional.cross_entropy(model(features), labels).backward()


if __name__ == "__main__":
    main()
