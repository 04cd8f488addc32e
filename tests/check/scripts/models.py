import torch
import torch.nn as nn


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)
        self.register_buffer("scale", torch.ones(1, device=torch.device("cuda")))

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1)).double().to(self.scale.device)


def unused_helper(x):
    return x.cuda()


if __name__ == "__main__":
    print(SmallNet().cuda())
