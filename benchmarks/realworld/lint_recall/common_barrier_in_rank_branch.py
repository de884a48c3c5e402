# expect: DDP305:22
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1000):
        loss = model(torch.randn(16, 32, device="cuda")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 and dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "ckpt.pt")
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
