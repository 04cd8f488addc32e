"""A careful script: device chosen at run time, workers under a main guard, functions at module
level, checkpoints mapped to the device."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __init__(self, size, transform=None):
        self.size, self.transform = size, transform

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        x = torch.tensor([float(index)])
        return (self.transform(x) if self.transform else x), x ** 2


def scale(x):
    return x / 100


def collate(batch):
    return torch.utils.data.default_collate(batch)


def seed_worker(worker_id):
    torch.manual_seed(worker_id)


def pick_device():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--resume", default="")
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()
    device = pick_device()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    loader = DataLoader(Squares(512, transform=scale), batch_size=32, num_workers=args.workers,
                        collate_fn=collate, worker_init_fn=seed_worker,
                        pin_memory=device.type == "cuda", persistent_workers=args.workers > 0)
    model = torch.nn.Linear(1, 1).to(device)
    if args.cuda:
        model = model.cuda()
    if args.resume:
        model.load_state_dict(torch.load(args.resume, map_location=device))
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    optimizer = torch.optim.Adam(model.parameters())
    metric = torch.zeros(1, dtype=torch.float64)  # float64 on the CPU only
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        with torch.autocast(device.type, enabled=device.type != "cpu"):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        metric += loss.detach().cpu().double()
    try:
        stats = torch.load("stats.pt")
    except RuntimeError:
        stats = None
    print(metric.item(), stats)


if __name__ == "__main__":
    main()
