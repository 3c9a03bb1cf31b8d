"""Import-time shims for driving a released SGLang wheel on a CPU-only machine
(conformance-notes.md §2). Imported by the worker before anything of sglang.

Runs inside the conformance environment, not reqmodel's: standard library and
torch only.
"""
import importlib.util
import os
import platform
import sys
from unittest import mock


def torchvision_ops() -> None:
    """PyPI's torchvision is CUDA-only: its extension fails to load silently and
    its meta registrations then raise "operator torchvision::nms does not
    exist". Declare the two schemas it registers fakes for; nothing on the
    probed path calls them."""
    import torch
    try:
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
        return
    except RuntimeError:
        pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    torchvision_ops.lib = lib  # keep the definitions alive


def triton_stub() -> None:
    """Without triton, load the wheel's own stub (``sglang/_platform_stubs.py``,
    enabled upstream only on Apple silicon) by path, without running
    ``sglang/__init__``, and install it as if on darwin/arm64/MPS."""
    if importlib.util.find_spec("triton") is not None:
        return
    for entry in sys.path:
        path = os.path.join(entry, "sglang", "_platform_stubs.py")
        if os.path.exists(path):
            break
    else:
        raise ImportError("sglang/_platform_stubs.py not found on sys.path")
    spec = importlib.util.spec_from_file_location("sglang._platform_stubs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sglang._platform_stubs"] = module
    spec.loader.exec_module(module)
    import torch
    with mock.patch.object(sys, "platform", "darwin"), \
            mock.patch.object(platform, "machine", lambda: "arm64"), \
            mock.patch.object(torch.backends.mps, "is_available", lambda: True):
        module.install_platform_stubs()


def install() -> None:
    torchvision_ops()
    triton_stub()
