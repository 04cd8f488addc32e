"""An Accelerate script: the device, the precision and the processes come from Accelerator()."""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def collate(batch):
    return torch.utils.data.default_collate(batch)


def main():
    accelerator = Accelerator()
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=2, collate_fn=collate,
                        pin_memory=accelerator.device.type == "cuda")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for features, labels in loader:
            with accelerator.autocast():
                loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(epoch, loss.item())
    accelerator.save_state("checkpoint")
    state = torch.load("checkpoint/extra.pt", map_location="cpu", weights_only=True)
    accelerator.print(state)


if __name__ == "__main__":
    main()
