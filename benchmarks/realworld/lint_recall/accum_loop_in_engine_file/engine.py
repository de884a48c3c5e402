# expect: DDP203:12
import torch


def train_one_epoch(model, loader, optimizer, accum_iter=1):
    model.train()
    criterion = torch.nn.CrossEntropyLoss()
    optimizer.zero_grad()
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = criterion(model(x), y) / accum_iter
        loss.backward()
        if (step + 1) % accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
