# expect: DDP305:25
# FSDP's FULL_STATE_DICT gathering is a collective; calling model.state_dict() only on rank 0 hangs.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = FSDP(torch.nn.Linear(32, 10).cuda())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(100):
        loss = model(torch.randn(16, 32, device="cuda")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
            state = model.state_dict()
        torch.save(state, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
