"""DDP304 load-map-location: ``torch.load`` onto this process's device.

A checkpoint saved from GPU 0 is restored onto GPU 0 by every process unless
``map_location`` says otherwise: N copies on one GPU, and a crash on a CPU-only
machine (D4).  ``torch.load(path)`` gets ``map_location=device``::

    state = torch.load(args.resume)

becomes::

    state = torch.load(args.resume, map_location=device)

where ``device`` is this process's device (defined in the function if needed).
"""

from __future__ import annotations

import re

import libcst as cst

from . import _names as N
from . import _patterns as P
from ._base import FileRole, Transform


class LoadMapLocation(Transform):
    CODE = "DDP304"
    NAME = "load-map-location"
    DESCRIPTION = "Give torch.load a map_location: this process's device."
    # torch.load is reached through the word "load" (torch.load, from torch import
    # load): DataLoader and load_state_dict alone do not trigger the transform
    TRIGGERS = (re.compile(r"\bload\b"),)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.is_call(original_node, N.TORCH_LOAD):
            return updated_node
        positional = [a for a in original_node.args if a.keyword is None and not a.star]
        if len(positional) >= 2 or any(
            a.keyword is not None and a.keyword.value == "map_location" for a in original_node.args
        ) or any(a.star for a in original_node.args):
            return updated_node
        device = self.rank_name(original_node, "device")
        if device is None:
            self.manual(original_node, "torch.load without map_location: load onto this process's device")
            return updated_node
        self.changed(original_node, f"torch.load(..., map_location={device}): onto this process's device")
        return P.append_arg(updated_node, P.keyword_arg("map_location", cst.Name(device)))
