"""A main() that is called without the guard, and a lambda as collate_fn."""
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

NUM_WORKERS = 4


def train(args):
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=NUM_WORKERS,
                        collate_fn=lambda batch: torch.utils.data.default_collate(batch))
    model = torch.nn.Linear(8, 2)
    for features, labels in loader:
        model(features).sum().backward()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=32)
    train(parser.parse_args())


main()
