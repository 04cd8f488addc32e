"""Loader workers from an option, and a collate function defined inside main()."""
import argparse

import torch
from torch.utils.data import DataLoader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataloader_num_workers", type=int, default=0)
    parser.add_argument("--eval_workers", type=int, default=2)
    args = parser.parse_args()

    def collate_fn(examples):
        return torch.stack(examples)

    data = [torch.ones(2) for _ in range(8)]
    train = DataLoader(data, batch_size=4, collate_fn=collate_fn, num_workers=args.dataloader_num_workers)
    evaluation = DataLoader(data, batch_size=4, collate_fn=collate_fn, num_workers=args.eval_workers)
    return train, evaluation


if __name__ == "__main__":
    main()
