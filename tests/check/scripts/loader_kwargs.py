"""A segmentation trainer's habits: loader settings in one dict, and a gradient scaler switched
on by the precision the GPU lacks."""
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(epochs=1):
    data = TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    loader_args = dict(batch_size=8, num_workers=os.cpu_count(), pin_memory=True)
    train_loader = DataLoader(data, shuffle=True, **loader_args)
    half = not torch.cuda.is_bf16_supported()
    scaler = torch.cuda.amp.GradScaler(enabled=half)
    quiet_scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
    model = torch.nn.Linear(3, 1)
    for _ in range(epochs):
        for x, y in train_loader:
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    return quiet_scaler


if __name__ == "__main__":
    train()
