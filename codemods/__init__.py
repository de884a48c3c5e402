"""The convert transforms, one per module, applied in this order.

Each module holds one LibCST codemod: its code (shared with the lint rule for the
same pitfall), a short name, a description and examples in its docstring.
"""

from .device import RankDevice
from .dp_to_ddp import DataParallelToDDP
from .process_group import ProcessGroupSetup
from .load_map_location import LoadMapLocation
from .module_access import ModuleAccess
from .no_sync import NoSyncAccumulation
from .output_on_main import OutputOnMainProcess
from .sampler import DistributedSamplerTransform
from .save_on_main import SaveOnMainProcess
from .set_epoch import SetEpoch
from .wrap_model import WrapModel

#: Order matters: devices first (later transforms reuse ``device``), then the
#: wrap, data, training-step and side-effect transforms, the setup last.
TRANSFORMS = (
    RankDevice,
    DataParallelToDDP,
    WrapModel,
    ModuleAccess,
    DistributedSamplerTransform,
    SetEpoch,
    NoSyncAccumulation,
    SaveOnMainProcess,
    OutputOnMainProcess,
    LoadMapLocation,
    ProcessGroupSetup,
)

__all__ = ["TRANSFORMS"]
