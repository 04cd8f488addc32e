# %% [markdown]
# # Launching from a notebook with `mpslaunch.launch`
#
# Each `# %%` block is a notebook cell (Jupyter, VS Code, or `jupytext --to notebook`); the file
# also runs as a script: `python examples/notebook_launch.py`.
# `mpslaunch.launch` makes the plan `mpslaunch launch` would make on this machine: mps on Apple
# silicon, a GPU elsewhere (one process per GPU), the CPU otherwise.

# %%
import mpslaunch


def train(steps: int):
    """An unmodified Accelerate training function: it follows the plan through the environment."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs = torch.randn(64, 8, device=accelerator.device)
    targets = inputs.sum(dim=1, keepdim=True)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    result = (accelerator.process_index, accelerator.device.type, round(loss.item(), 4))
    accelerator.end_training()
    return result


# %% One process on this machine's device, in this process: the function's result comes back.
print(mpslaunch.launch(train, 20))

# %% Two CPU processes (gloo, as on a Mac, where only one process can use the GPU): a dict of
# each rank's result. With several NVIDIA GPUs, drop cpu=True and num_processes: one per GPU.
print(mpslaunch.launch(train, 20, cpu=True, num_processes=2))
