# expect: DDP004:14
# SLURM job: the global SLURM_PROCID used as the GPU index (rank 8 asks for GPU 8 on node 2).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    proc_id = int(os.environ["SLURM_PROCID"])
    ntasks = int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("nccl", rank=proc_id, world_size=ntasks)
    torch.cuda.set_device(proc_id)
    return proc_id


def main():
    setup()
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[torch.cuda.current_device()])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        loss = model(torch.randn(16, 32, device="cuda")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
