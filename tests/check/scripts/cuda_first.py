"""Fine-tune a small convnet on CIFAR-style image folders; written for one NVIDIA GPU."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from models import SmallNet


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--resume", default="")
    return parser.parse_args()


def main():
    args = parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(backend="nccl")
    torch.set_default_dtype(torch.float64)
    scale = transforms.Lambda(lambda image: image * 2 - 1)
    train_set = datasets.ImageFolder(os.path.join(args.data, "train"),
                                     transform=transforms.Compose([transforms.ToTensor(), scale]))

    def collate(batch):
        return torch.utils.data.default_collate(batch)

    loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=args.workers,
                        pin_memory=True, collate_fn=collate)
    model = SmallNet().cuda()
    if args.resume:
        model.load_state_dict(torch.load(args.resume))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = GradScaler()
    for epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.to("cuda", non_blocking=True), labels.to("cuda")
            with autocast():
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        weights = torch.ones(10, device="cuda", dtype=torch.float64)
        print(epoch, loss.item(), weights.sum().item())
    torch.save(model.state_dict(), "checkpoint.pt")


if __name__ == "__main__":
    main()
