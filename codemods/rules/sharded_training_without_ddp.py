"""DDP009 sharded-training-without-ddp."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from .. import _names as N
from .._analysis import (
    Source,
    argument,
    assigned_name,
    classify_loader,
    dotted,
    is_collective,
    is_eval_name,
    optimizers_of_unwrapped_models,
    PARAMETER_METHODS,
    PARTLY_WRAPPED_ADVICE,
    partly_wrapped_models,
    wrapped_models,
)
from ._base import Diagnostic, Rule

#: what synchronises gradients without DistributedDataParallel: FSDP, or a
#: framework that wraps the model or the optimizer itself
_SYNC_PREFIXES = (
    "torch.distributed.fsdp",
    "torch.distributed._composable",
    "torch.distributed.optim",
    "torch.distributed.algorithms",
)
_FRAMEWORKS = ("horovod", "deepspeed", "accelerate", "apex", "fairscale", "lightning", "pytorch_lightning", "colossalai")
#: words in the text without which nothing of the above can be named
_SYNC_WORDS = re.compile(r"fsdp|fully_shard|_composable|distributed\.optim|algorithms")


class ShardedTrainingWithoutDDP(Rule):
    """
    ## What it does
    Reports an optimizer over a model that is never wrapped in
    DistributedDataParallel (nor FSDP, nor a framework's wrapper) in a file whose
    data loader shards the data with a `DistributedSampler` and whose training
    step runs the model itself (`model(x)` ... `loss.backward()`). Only models
    built in the file (`Net()`, `torchvision.models.resnet18()`, moved with
    `.to(device)`) are judged; one that comes from a helper (`model =
    setup(model)`) may be wrapped there and is not reported, nor is a file that
    all-reduces gradients by hand. In a file that wraps some models and not
    others (a GAN's generator but not its discriminator), the others are
    reported; where DDP wraps something that cannot be named (`DDP(build())`),
    nothing is. Also a wrap of a part of a model that trains as a whole
    (`model.encoder = DDP(model.encoder)` with an optimizer over
    `model.parameters()`, or one built elsewhere): the rest of the model is not
    synchronised.

    ## Why is this bad?
    Nothing averages the gradients: each process updates its own copy of the
    model from its own shard of the data, the copies drift apart, and rank 0
    saves a model that saw 1/N of the data. The script runs without an error.

    ## Example
    ```python
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ```

    ## Use instead
    ```python
    model = DistributedDataParallel(Net().to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ```

    ## Fix safety
    No automatic fix (`dp2ddp convert` wraps the model of a single-GPU script; a
    script that is distributed already is left to its author).
    """

    CODE = "DDP009"
    NAME = "sharded-training-without-ddp"
    SEVERITY = "error"
    MESSAGE = (
        "this optimizer trains `{name}`, which is never wrapped in DistributedDataParallel, on sharded "
        "data (DistributedSampler): nothing averages the gradients, so each process trains its own copy "
        "on its shard and the copies drift apart; wrap it ({name} = DistributedDataParallel({name}, "
        "device_ids=[local_rank])) before training"
    )
    TRIGGERS = (("DistributedSampler", "backward"), ("DistributedDataParallel", "parameters"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for assign, whole, part in partly_wrapped_models(src, N.DDP):
            yield self.diagnostic(src, assign, PARTLY_WRAPPED_ADVICE.format(whole=whole, part=part))
        if not _shards_training_data(src) or _synchronised(src):
            return
        wrapped = wrapped_models(src, N.DDP)
        if wrapped is None:
            return  # a DDP wrap of something this cannot name
        for call, name in optimizers_of_unwrapped_models(src, wrapped, N.DDP):
            yield self.diagnostic(src, call, self.MESSAGE.format(name=name))


def _shards_training_data(src: Source) -> bool:
    """A DistributedSampler that is not for evaluation (by its name, its
    dataset's, or its loader's)."""
    for sampler in src.calls_to(N.DISTRIBUTED_SAMPLER):
        dataset = argument(sampler, 0, "dataset")
        names = [assigned_name(src, sampler).rsplit(".", 1)[-1], dotted(dataset).rsplit(".", 1)[-1]]
        if any(is_eval_name(name) for name in names if name):
            continue
        keyword = src.parent(sampler)
        loader = src.parent(keyword) if isinstance(keyword, ast.keyword) else None
        if isinstance(loader, ast.Call) and src.is_call(loader, N.DATA_LOADER) and classify_loader(src, loader) == "eval":
            continue
        return True
    return False


def _synchronised(src: Source) -> bool:
    """Something in the file averages the gradients: a DDP/FSDP wrapper (named
    at all), a framework that wraps, or a collective over gradients."""
    if any(src.imports_module(framework) for framework in _FRAMEWORKS):
        return True
    if _SYNC_WORDS.search(src.text):
        for node in src.nodes:
            if isinstance(node, (ast.Name, ast.Attribute)) and src.qualname(node).startswith(_SYNC_PREFIXES):
                return True
    for call in src.calls:
        hook = isinstance(call.func, ast.Attribute) and call.func.attr == "register_hook"
        if (hook or is_collective(src, call)) and any(
            "grad" in dotted(node).lower() for arg in call.args for node in ast.walk(arg)
        ):
            return True  # dist.all_reduce(p.grad), p.register_hook(average_grad)
        if is_collective(src, call) and _over_parameters(src, call):
            return True  # local SGD: the parameters themselves averaged every k steps
    return False


def _over_parameters(src: Source, call: ast.Call) -> bool:
    """The collective is in a loop over a model's parameters (``for p in
    model.parameters(): dist.all_reduce(p.data)``)."""
    for loop in src.ancestors(call):
        if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Attribute):
            if loop.iter.func.attr in PARAMETER_METHODS:
                return True
    return False


