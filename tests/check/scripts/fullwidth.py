"""A training script whose identifiers are spelled in fullwidth letters, which Python reads as
their ASCII forms (NFKC)."""
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--init", default="")
    args = parser.parse_args()

    model = torch.nn.Linear(8, 2)
    model.ｃｕｄａ()
    if args.init:
        model.load_state_dict(torch.ｌｏａｄ(args.init))
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    device = torch.device("mps")
    weights = torch.ones(2, dtype=torch.ｆｌｏａｔ６４).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.epochs):
        for features, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(features.ｃｕｄａ()), labels.ｃｕｄａ())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(weights.sum().item())


if __name__ == "__main__":
    main()
