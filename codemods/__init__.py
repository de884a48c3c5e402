"""The convert transforms (LibCST) and, in ``rules``, the lint rules (``ast``).

Each transform module holds one LibCST codemod: its code (shared with the lint
rule for the same pitfall), a short name, a description and examples in its
docstring.  ``TRANSFORMS`` is loaded on first use, so that ``dp2ddp lint`` (which
only needs ``rules``) never imports LibCST.
"""

from typing import Tuple


def _transforms() -> Tuple[type, ...]:
    from .device import RankDevice
    from .dp_to_ddp import DataParallelToDDP
    from .load_map_location import LoadMapLocation
    from .module_access import ModuleAccess
    from .no_sync import NoSyncAccumulation
    from .output_on_main import OutputOnMainProcess
    from .process_group import ProcessGroupSetup
    from .random_split import RandomSplit
    from .sampler import DistributedSamplerTransform
    from .save_on_main import SaveOnMainProcess
    from .set_epoch import SetEpoch
    from .unused_parameters import UnusedParameters
    from .wrap_after_changes import WrapAfterChanges
    from .wrap_model import WrapModel

    # Order matters: devices first (later transforms reuse `device`), then the
    # wrap, data, training-step and side-effect transforms, the setup last.
    return (
        RankDevice,
        DataParallelToDDP,
        WrapModel,
        WrapAfterChanges,
        UnusedParameters,
        ModuleAccess,
        DistributedSamplerTransform,
        RandomSplit,
        SetEpoch,
        NoSyncAccumulation,
        SaveOnMainProcess,
        OutputOnMainProcess,
        LoadMapLocation,
        ProcessGroupSetup,
    )


def __getattr__(name: str):
    if name == "TRANSFORMS":
        value = _transforms()
        globals()["TRANSFORMS"] = value
        return value
    raise AttributeError(name)


__all__ = ["TRANSFORMS"]
