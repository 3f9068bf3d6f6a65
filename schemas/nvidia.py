# SPDX-License-Identifier: Apache-2.0
"""NVIDIA driver ioctls by name: the one table of request numbers the GPU
driver probe sees, and ``ioctl_name(request)``. Pure: no I/O.

Taken from NVIDIA's open kernel modules,
github.com/NVIDIA/open-gpu-kernel-modules at commit
df1c9a3de2be4b130f4fc7680f7198193d8ac6ad (release 595.45.04):

- src/nvidia/arch/nvalloc/unix/include/nv_escape.h: ``NV_ESC_RM_*``, the
  resource manager's calls (alloc, free, control, map, ...);
- src/nvidia/arch/nvalloc/unix/include/nv-ioctl-numbers.h (and
  nv-ioctl-numa.h): ``NV_IOCTL_MAGIC`` 'F', ``NV_IOCTL_BASE`` 200 and the
  ``NV_ESC_*`` at BASE + n;
- kernel-open/nvidia-uvm/uvm_ioctl.h: ``UVM_*`` = ``UVM_IOCTL_BASE(i)``,
  which is plain ``i`` on Linux; kernel-open/nvidia-uvm/uvm_linux_ioctl.h:
  ``UVM_INITIALIZE`` 0x30000001, ``UVM_DEINITIALIZE`` 0x30000002.

Names that release 515.43.04 (commit 1739a20efc4acb55fd1dc53dcc66057b70c2613c)
still had and 595.45.04 dropped are kept, marked below: fleets run old
drivers, and no number was reused.

How the numbers reach the kernel:

- /dev/nvidiactl and /dev/nvidiaN: user space calls
  ``ioctl(fd, _IOWR('F', NR, sizeof(params)), &params)``; the driver
  (kernel-open/nvidia/nv.c, ``nvidia_ioctl``) dispatches on ``_IOC_NR``
  alone, so the name is the NR's whatever the size (NV_ESC_RM_ALLOC, say,
  comes as NVOS21 or NVOS64 parameters: 32 or 48 bytes).
  ``NV_ESC_IOCTL_XFER_CMD`` carries a call whose parameters are too big for
  the 14-bit size field; the real NR is in the caller's memory, out of a
  tracepoint's sight, so such calls are named XFER.
- /dev/nvidia-uvm: the plain number, no _IOC encoding (type byte 0).

The two spaces do not overlap: an RM call's type byte is 'F' (0x46), a UVM
call's is 0.
"""

from __future__ import annotations

NV_IOCTL_MAGIC = ord("F")
NV_IOCTL_BASE = 200

# asm-generic/ioctl.h: nr 8 bits, type 8, size 14, direction 2
_IOC_NRBITS, _IOC_TYPEBITS, _IOC_SIZEBITS = 8, 8, 14
_IOC_TYPESHIFT = _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
_IOC_WRITE, _IOC_READ = 1, 2

#: _IOC_NR of an 'F' ioctl on /dev/nvidiactl or /dev/nvidiaN -> its name
RM_ESCAPES: dict[int, str] = {
    # nv_escape.h
    0x27: "NV_ESC_RM_ALLOC_MEMORY",
    0x28: "NV_ESC_RM_ALLOC_OBJECT",
    0x29: "NV_ESC_RM_FREE",
    0x2A: "NV_ESC_RM_CONTROL",
    0x2B: "NV_ESC_RM_ALLOC",
    0x32: "NV_ESC_RM_CONFIG_GET",      # 515.43.04, gone by 595.45.04
    0x33: "NV_ESC_RM_CONFIG_SET",      # 515.43.04, gone by 595.45.04
    0x34: "NV_ESC_RM_DUP_OBJECT",
    0x35: "NV_ESC_RM_SHARE",
    0x37: "NV_ESC_RM_CONFIG_GET_EX",   # 515.43.04, gone by 595.45.04
    0x38: "NV_ESC_RM_CONFIG_SET_EX",   # 515.43.04, gone by 595.45.04
    0x39: "NV_ESC_RM_I2C_ACCESS",
    0x41: "NV_ESC_RM_IDLE_CHANNELS",
    0x4A: "NV_ESC_RM_VID_HEAP_CONTROL",
    0x4D: "NV_ESC_RM_ACCESS_REGISTRY",
    0x4E: "NV_ESC_RM_MAP_MEMORY",
    0x4F: "NV_ESC_RM_UNMAP_MEMORY",
    0x52: "NV_ESC_RM_GET_EVENT_DATA",
    0x54: "NV_ESC_RM_ALLOC_CONTEXT_DMA2",
    0x56: "NV_ESC_RM_ADD_VBLANK_CALLBACK",
    0x57: "NV_ESC_RM_MAP_MEMORY_DMA",
    0x58: "NV_ESC_RM_UNMAP_MEMORY_DMA",
    0x59: "NV_ESC_RM_BIND_CONTEXT_DMA",
    0x5C: "NV_ESC_RM_EXPORT_OBJECT_TO_FD",
    0x5D: "NV_ESC_RM_IMPORT_OBJECT_FROM_FD",
    0x5E: "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO",
    0x5F: "NV_ESC_RM_LOCKLESS_DIAGNOSTIC",
    # nv-ioctl-numbers.h, nv-ioctl-numa.h: NV_IOCTL_BASE + n
    NV_IOCTL_BASE + 0: "NV_ESC_CARD_INFO",
    NV_IOCTL_BASE + 1: "NV_ESC_REGISTER_FD",
    NV_IOCTL_BASE + 6: "NV_ESC_ALLOC_OS_EVENT",
    NV_IOCTL_BASE + 7: "NV_ESC_FREE_OS_EVENT",
    NV_IOCTL_BASE + 9: "NV_ESC_STATUS_CODE",
    NV_IOCTL_BASE + 10: "NV_ESC_CHECK_VERSION_STR",
    NV_IOCTL_BASE + 11: "NV_ESC_IOCTL_XFER_CMD",
    NV_IOCTL_BASE + 12: "NV_ESC_ATTACH_GPUS_TO_FD",
    NV_IOCTL_BASE + 13: "NV_ESC_QUERY_DEVICE_INTR",
    NV_IOCTL_BASE + 14: "NV_ESC_SYS_PARAMS",
    NV_IOCTL_BASE + 15: "NV_ESC_NUMA_INFO",
    NV_IOCTL_BASE + 16: "NV_ESC_SET_NUMA_STATUS",
    NV_IOCTL_BASE + 17: "NV_ESC_EXPORT_TO_DMABUF_FD",
    NV_IOCTL_BASE + 18: "NV_ESC_WAIT_OPEN_COMPLETE",
}

#: request number of an ioctl on /dev/nvidia-uvm -> its name
UVM_IOCTLS: dict[int, str] = {
    1: "UVM_RESERVE_VA", 2: "UVM_RELEASE_VA", 3: "UVM_REGION_COMMIT", 4: "UVM_REGION_DECOMMIT",
    5: "UVM_REGION_SET_STREAM", 6: "UVM_SET_STREAM_RUNNING", 7: "UVM_SET_STREAM_STOPPED",
    9: "UVM_RUN_TEST",                    # 515.43.04, gone by 595.45.04
    10: "UVM_ADD_SESSION",
    11: "UVM_REMOVE_SESSION",             # 515.43.04, gone by 595.45.04
    12: "UVM_ENABLE_COUNTERS", 13: "UVM_MAP_COUNTER", 14: "UVM_CREATE_EVENT_QUEUE",
    15: "UVM_REMOVE_EVENT_QUEUE", 16: "UVM_MAP_EVENT_QUEUE", 17: "UVM_EVENT_CTRL",
    18: "UVM_REGISTER_MPS_SERVER",        # 515.43.04, gone by 595.45.04
    19: "UVM_REGISTER_MPS_CLIENT",        # 515.43.04, gone by 595.45.04
    20: "UVM_GET_GPU_UUID_TABLE", 21: "UVM_REGION_SET_BACKING", 22: "UVM_REGION_UNSET_BACKING",
    23: "UVM_CREATE_RANGE_GROUP", 24: "UVM_DESTROY_RANGE_GROUP", 25: "UVM_REGISTER_GPU_VASPACE",
    26: "UVM_UNREGISTER_GPU_VASPACE", 27: "UVM_REGISTER_CHANNEL", 28: "UVM_UNREGISTER_CHANNEL",
    29: "UVM_ENABLE_PEER_ACCESS", 30: "UVM_DISABLE_PEER_ACCESS", 31: "UVM_SET_RANGE_GROUP",
    33: "UVM_MAP_EXTERNAL_ALLOCATION", 34: "UVM_FREE", 35: "UVM_MEM_MAP",
    36: "UVM_DEBUG_ACCESS_MEMORY",        # 515.43.04, gone by 595.45.04
    37: "UVM_REGISTER_GPU", 38: "UVM_UNREGISTER_GPU", 39: "UVM_PAGEABLE_MEM_ACCESS",
    40: "UVM_PREVENT_MIGRATION_RANGE_GROUPS", 41: "UVM_ALLOW_MIGRATION_RANGE_GROUPS",
    42: "UVM_SET_PREFERRED_LOCATION", 43: "UVM_UNSET_PREFERRED_LOCATION",
    44: "UVM_ENABLE_READ_DUPLICATION", 45: "UVM_DISABLE_READ_DUPLICATION",
    46: "UVM_SET_ACCESSED_BY", 47: "UVM_UNSET_ACCESSED_BY", 51: "UVM_MIGRATE",
    53: "UVM_MIGRATE_RANGE_GROUP",
    54: "UVM_ENABLE_SYSTEM_WIDE_ATOMICS",   # 515.43.04, gone by 595.45.04
    55: "UVM_DISABLE_SYSTEM_WIDE_ATOMICS",  # 515.43.04, gone by 595.45.04
    56: "UVM_TOOLS_INIT_EVENT_TRACKER", 57: "UVM_TOOLS_SET_NOTIFICATION_THRESHOLD",
    58: "UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS", 59: "UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS",
    60: "UVM_TOOLS_ENABLE_COUNTERS", 61: "UVM_TOOLS_DISABLE_COUNTERS", 62: "UVM_TOOLS_READ_PROCESS_MEMORY",
    63: "UVM_TOOLS_WRITE_PROCESS_MEMORY", 64: "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE",
    65: "UVM_MAP_DYNAMIC_PARALLELISM_REGION", 66: "UVM_UNMAP_EXTERNAL", 67: "UVM_TOOLS_FLUSH_EVENTS",
    68: "UVM_ALLOC_SEMAPHORE_POOL", 69: "UVM_CLEAN_UP_ZOMBIE_RESOURCES", 70: "UVM_PAGEABLE_MEM_ACCESS_ON_GPU",
    71: "UVM_POPULATE_PAGEABLE", 72: "UVM_VALIDATE_VA_RANGE", 73: "UVM_CREATE_EXTERNAL_RANGE",
    74: "UVM_MAP_EXTERNAL_SPARSE", 75: "UVM_MM_INITIALIZE", 76: "UVM_TOOLS_INIT_EVENT_TRACKER_V2",
    77: "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2", 78: "UVM_ALLOC_DEVICE_P2P",
    79: "UVM_CLEAR_ALL_ACCESS_COUNTERS", 80: "UVM_DISCARD", 2047: "UVM_IS_8_SUPPORTED",
    # uvm_linux_ioctl.h
    0x30000001: "UVM_INITIALIZE", 0x30000002: "UVM_DEINITIALIZE",
}

_RM_BY_NAME = {name: nr for nr, name in RM_ESCAPES.items()}
_UVM_BY_NAME = {name: number for number, name in UVM_IOCTLS.items()}


def iowr(nr: int, size: int, magic: int = NV_IOCTL_MAGIC) -> int:
    """``_IOWR(magic, nr, size)``: how user space encodes an RM call."""
    if not (0 <= nr < 1 << _IOC_NRBITS and 0 <= size < 1 << _IOC_SIZEBITS):
        raise ValueError(f"nr {nr} or size {size} out of range")
    return ((_IOC_READ | _IOC_WRITE) << _IOC_DIRSHIFT | size << _IOC_SIZESHIFT
            | magic << _IOC_TYPESHIFT | nr)


def ioctl_name(request: int) -> str:
    """The driver's name for an ioctl request on an NVIDIA device file
    (``NV_ESC_RM_CONTROL``, ``UVM_MIGRATE``, ...), or the request in hex
    (``0x...``: never a name) when it is neither driver's."""
    request &= 0xFFFFFFFF  # the kernel's unsigned int cmd
    if (request >> _IOC_TYPESHIFT) & 0xFF == NV_IOCTL_MAGIC:
        name = RM_ESCAPES.get(request & 0xFF)
    else:
        name = UVM_IOCTLS.get(request)
    return name or f"0x{request:x}"


def ioctl_request(name: str, size: int = 0) -> int:
    """The request number of a named call: ``_IOWR('F', NR, size)`` for an
    RM call (``size``: its parameters' size, as user space passes it), the
    plain number for a UVM one. KeyError for a name in neither table."""
    if name in _RM_BY_NAME:
        return iowr(_RM_BY_NAME[name], size)
    return _UVM_BY_NAME[name]
