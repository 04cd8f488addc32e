"""A one-file GAN in the old style: a cuda flag, .cuda() under it, and a tensor type chosen by it."""
import numpy as np
import torch
from torch import nn

cuda = torch.cuda.is_available()

generator = nn.Sequential(nn.Linear(16, 64), nn.Tanh())
critic = nn.Sequential(nn.Linear(64, 1), nn.Sigmoid())
loss_function = nn.BCELoss()
if cuda:
    generator.cuda()
    critic.cuda()
    loss_function.cuda()

Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor


def train(steps):
    for _ in range(steps):
        noise = Tensor(np.random.normal(0, 1, (8, 16)))
        real = Tensor(8, 1).fill_(1.0)
        loss_function(critic(generator(noise)), real).backward()


if __name__ == "__main__":
    train(2)
