import torch

# The models here are tiny: one thread computes a step as fast as several, and several spin
# against each other (and against anything else on the machine), which slows the suite tenfold.
torch.set_num_threads(1)
