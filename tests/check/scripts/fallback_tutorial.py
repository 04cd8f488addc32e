"""A beginner's tutorial: the device is picked once at the top, the CPU when CUDA is missing."""
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
inputs = torch.randn(32, 8, device=device)
# a float64 reference on that same device: on a Mac the device is the CPU, where float64 works
reference = torch.randn(32, 1, device=device, dtype=torch.float64)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(3):
    loss = ((net(inputs).double() - reference) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f} on {device}")
