"""Qualified names of the torch (and friends) APIs that the transforms care about.

Matching is always done on qualified names resolved through LibCST metadata
(the scopes of ``ScopeProvider``, as ``QualifiedNameProvider`` does), so every import spelling is recognised:
``torch.nn.DataParallel``, ``nn.DataParallel`` after ``import torch.nn as nn``,
``DP`` after ``from torch.nn.parallel import DataParallel as DP``.  A project's own
class that happens to be called ``DataParallel`` resolves to a local name and is
never mistaken for torch's.
"""

from __future__ import annotations

DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
)
DATA_PARALLEL_FUNCTION = frozenset(
    {
        "torch.nn.parallel.data_parallel",
        "torch.nn.parallel.data_parallel.data_parallel",
    }
)
#: the class and the function: what "uses DataParallel" means
ANY_DATA_PARALLEL = DATA_PARALLEL | DATA_PARALLEL_FUNCTION
DDP = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)
DATA_LOADER = frozenset(
    {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
)
#: plain samplers that a DistributedSampler replaces (shuffle=True / False)
RANDOM_SAMPLER = frozenset({"torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler"})
SEQUENTIAL_SAMPLER = frozenset({"torch.utils.data.SequentialSampler", "torch.utils.data.sampler.SequentialSampler"})
BATCH_SAMPLER = frozenset({"torch.utils.data.BatchSampler", "torch.utils.data.sampler.BatchSampler"})
#: torch's samplers that draw from the same data on every rank and have no
#: DistributedSampler twin (their weights or indices would be lost): for a human
WEIGHTED_OR_SUBSET_SAMPLER = frozenset({
    "torch.utils.data.WeightedRandomSampler", "torch.utils.data.sampler.WeightedRandomSampler",
    "torch.utils.data.SubsetRandomSampler", "torch.utils.data.sampler.SubsetRandomSampler",
})
ITERABLE_DATASET = frozenset(
    {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
)
RANDOM_SPLIT = frozenset({"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"})
#: seeding torch's default generator: ``torch.manual_seed`` and the helpers that call it
TORCH_SEED = frozenset({"torch.manual_seed", "torch.random.manual_seed"})
SEED_HELPERS = frozenset({"seed_everything", "set_seed", "set_random_seed", "seed_all", "fix_seed", "setup_seed", "init_seeds"})
DISTRIBUTED_SAMPLER = frozenset(
    {
        "torch.utils.data.DistributedSampler",
        "torch.utils.data.distributed.DistributedSampler",
    }
)
TORCH_SAVE = frozenset({"torch.save"})
#: other files a training script writes whole: the same file from every rank
#: (sample grids of a GAN, loss plots, safetensors weights) -> the position of
#: the path argument
ARTIFACT_PATH_ARG = {
    "torchvision.utils.save_image": 1,
    "matplotlib.pyplot.savefig": 0,
    "matplotlib.pyplot.imsave": 0,
    "safetensors.torch.save_file": 1,
    "safetensors.torch.save_model": 1,
    "numpy.save": 0,
    "numpy.savez": 0,
    "numpy.savez_compressed": 0,
    "numpy.savetxt": 0,
}
ARTIFACT_WRITES = frozenset(ARTIFACT_PATH_ARG)
#: what reads such a file back (path first): a save of it then needs a barrier
ARTIFACT_READS = frozenset({"numpy.load", "numpy.loadtxt", "safetensors.torch.load_file", "matplotlib.pyplot.imread"})
TORCH_LOAD = frozenset({"torch.load"})
INIT_PROCESS_GROUP = frozenset({"torch.distributed.init_process_group"})
BARRIER = frozenset({"torch.distributed.barrier", "torch.distributed.distributed_c10d.barrier"})
DESTROY_PROCESS_GROUP = frozenset({"torch.distributed.destroy_process_group"})
SPAWN = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
    }
)
TORCH_DEVICE = frozenset({"torch.device"})
CUDA_IS_AVAILABLE = frozenset({"torch.cuda.is_available"})
CUDA_DEVICE_COUNT = frozenset({"torch.cuda.device_count"})
CUDA_SET_DEVICE = frozenset({"torch.cuda.set_device"})
CONVERT_SYNC_BN = frozenset(
    {
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm",
    }
)
SUMMARY_WRITER = frozenset(
    {
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
        "tensorboardX.SummaryWriter",
        "tensorboardX.writer.SummaryWriter",
    }
)
#: ``run = wandb.init(...)``: the run object whose ``run.log()`` goes to wandb
WANDB_INIT = frozenset({"wandb.init", "wandb.sdk.wandb_init.init"})
TQDM = frozenset(
    {
        "tqdm.tqdm",
        "tqdm.auto.tqdm",
        "tqdm.notebook.tqdm",
        "tqdm.std.tqdm",
        "tqdm.trange",
        "tqdm.auto.trange",
    }
)
#: ``logging`` calls that are progress chatter (the N copies of which we remove).
#: Warnings and errors keep coming from every rank: a rank's own problem matters.
LOGGING_CHATTER = frozenset({"logging.info", "logging.debug"})
#: print and its twins of the command-line libraries (``click.echo`` writes to stdout too)
PRINT = frozenset({"builtins.print", "click.echo", "click.secho", "click.utils.echo", "click.termui.secho", "typer.echo", "typer.secho"})
LOGGER_FACTORY = frozenset({"logging.getLogger"})
LOGGER_CHATTER_METHODS = frozenset({"info", "debug"})


def is_logger_name(dotted: str) -> bool:
    """``logger``, ``log``, ``self.logger``, ``train_logger``: what projects call the
    logger their own helper made (``logger = get_logger(cfg)``, HRNet's
    ``create_logger``), which name resolution cannot trace to ``logging``."""
    last = dotted.rsplit(".", 1)[-1].lower().lstrip("_")
    return last in ("log", "logger") or last.endswith("_logger")

#: Names in ``torch.optim`` that are not optimizers.
_NOT_OPTIMIZERS = ("torch.optim.lr_scheduler", "torch.optim.swa_utils")

#: torch.distributed collectives: reaching one on some ranks only is a deadlock.
COLLECTIVES = frozenset(
    "torch.distributed." + name
    for name in (
        "barrier",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "all_to_all",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "monitored_barrier",
    )
)


def is_optimizer(name: str) -> bool:
    """``torch.optim.SGD`` and friends (also ``torch.optim.sgd.SGD``), not schedulers."""
    if not name.startswith("torch.optim.") or name.startswith(_NOT_OPTIMIZERS):
        return False
    last = name.rsplit(".", 1)[-1]
    return last[:1].isupper() and last != "Optimizer"


def is_wandb(name: str) -> bool:
    return name == "wandb" or name.startswith("wandb.")


#: calls that cannot reach a collective or the model (``len``, ``.item()``,
#: ``os.path.join``): what may go behind ``if rank == 0:`` (``_patterns.is_pure``,
#: ``_analysis.is_pure``)
HARMLESS_FUNCS = frozenset(
    {"len", "str", "repr", "int", "float", "round", "format", "min", "max", "sum",
     "abs", "sorted", "list", "tuple", "dict", "type", "isinstance", "getattr",
     "vars", "enumerate", "zip", "range", "set", "frozenset", "bool", "any", "all",
     "reversed", "divmod", "pow", "hex", "oct", "bin", "chr", "ord", "hash", "id",
     "hasattr", "callable", "ascii"}
)
HARMLESS_METHODS = frozenset(
    {"item", "format", "join", "tolist", "numpy", "cpu", "detach", "size", "dim",
     "mean", "sum", "get", "keys", "values", "items", "time", "perf_counter",
     "strftime", "now", "upper", "lower", "strip", "replace", "numel", "avg",
     "get_last_lr", "state_dict", "device_count", "is_available", "get_device_name",
     "get_world_size", "get_rank", "memory_allocated", "max_memory_allocated",
     "getcwd", "join", "exists", "basename", "dirname", "count", "abspath", "realpath",
     "relpath", "isfile", "isdir", "getsize", "splitext", "dumps",
     # (a configuration turned into plain data to be written: json.dumps(cfg.to_dict()))
     "to_dict", "as_dict", "asdict", "to_json", "to_yaml", "isoformat", "hexdigest",
     "exp", "log", "log2", "log10", "sqrt", "floor", "ceil", "isnan", "isinf", "isfinite",
     # (a model's own tensors, listed: sum(p.numel() for p in model.parameters()))
     "parameters", "named_parameters", "buffers", "named_buffers",
     # (a tensor reshaped, rescaled or cast for an image grid: save_image(x.view(64, 1, 28, 28), p))
     "view", "reshape", "permute", "transpose", "squeeze", "unsqueeze", "flatten", "contiguous",
     "clone", "clamp", "clamp_", "float", "double", "half", "byte", "long", "add", "sub", "mul",
     "div", "add_", "sub_", "mul_", "div_", "expand", "repeat", "abs"}
)


#: what writes a whole file into an open file object (``json.dump(obj, f)``), the
#: methods that write into it (``f.write``, a csv writer's rows), the csv writers
WRITE_DUMPS = frozenset(
    {"json.dump", "yaml.dump", "yaml.safe_dump", "pickle.dump", "numpy.save", "numpy.savetxt", "torch.save"}
)
WRITE_METHODS = frozenset({"write", "writelines", "writerow", "writerows", "writeheader"})
CSV_WRITERS = frozenset({"csv.writer", "csv.DictWriter"})


#: calls that put a folder on ``sys.path`` (a script's own import set-up)
SYS_PATH_EDITS = frozenset({"sys.path.insert", "sys.path.append", "sys.path.extend", "site.addsitedir"})


#: what DistributedDataParallel forwards to its module or has itself: no ``.module`` needed
DDP_FORWARDS = frozenset(
    {
        "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers",
        "children", "named_children", "modules", "named_modules", "zero_grad", "to",
        "cuda", "cpu", "float", "double", "half", "bfloat16", "apply", "requires_grad_",
        "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "forward", "training", "no_sync", "module", "type", "share_memory", "join",
        "register_comm_hook", "__call__", "device_ids",
    }
)
