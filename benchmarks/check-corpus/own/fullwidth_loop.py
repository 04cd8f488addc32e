"""A second script with fullwidth identifiers (Python folds them to ASCII), and a fullwidth
string, which Python keeps as written: written for the check's labelled set."""
import torch
from torch.utils.data import DataLoader

ｂａｔｃｈ_ｓｉｚｅ = 32


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        return torch.tensor([float(index)]), torch.tensor([float(index * index)])


def train():
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = model.to("ｃｕｄａ" if False else "cpu")
    scaler = torch.ｃｕｄａ.amp.GradScaler()
    loader = DataLoader(Squares(), batch_size=ｂａｔｃｈ_ｓｉｚｅ, ｐｉｎ_ｍｅｍｏｒｙ=True)
    optimizer = torch.optim.Adam(model.parameters())
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    torch.ｃｕｄａ.ｓｙｎｃｈｒｏｎｉｚｅ()
    return model.ｄｏｕｂｌｅ()


if __name__ == "__main__":
    train()
