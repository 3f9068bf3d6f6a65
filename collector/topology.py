# SPDX-License-Identifier: Apache-2.0
"""The host's hardware topology: NUMA nodes, CPUs, and the PCI devices that
matter for inference (GPUs, NVMe, NICs) with the bridges they hang off.

The streams rules join kernel evidence with this to name NUMA and PCIe root
causes: "the GPU hangs off node 1 but the process runs on node 0", "nvme0 sits
on the same PCIe switch as GPU 3". Everything is read from sysfs and procfs
with injectable roots, so tests read fixture trees
(tests/fixtures/sysfs_builder.py); NVML is optional and only names GPUs and
refines their link state.

``read_topology`` returns the field values of ``schemas.events.Topology``; the
caller stamps the Record header. The questions the rules ask of a Topology
(pure functions, no /sys) live in ``schemas/topology.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jitterscope.collector.hostinfo import numa_nodes, online_cpus
from jitterscope.schemas.events import Cpu, NumaNode, PciDevice, Topology
from jitterscope.schemas.topology import normalize_pci_address, parse_cpu_list

# A PCI function address as sysfs names it. Domains are 4 hex digits, except
# behind Intel VMD, where the kernel invents 5-digit ones (10000:e0:1d.0).
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

NVIDIA = 0x10DE
CLASS_NVME = 0x010802  # mass storage / non-volatile memory / NVMe
# "16.0 GT/s PCIe" -> generation; older kernels print "8 GT/s" or "8.0 GT/s"
GT_PER_S_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
MEMTOTAL_KB = re.compile(r"MemTotal:\s+(\d+) kB")


def read_topology(sys: Path = Path("/sys"), proc: Path = Path("/proc"), nvml: object = True) -> dict:
    """The fields of a Topology record: cpus, numa_nodes, cpu_info, pci.

    ``nvml``: True uses nvidia-ml-py (``pynvml``) when it is installed and a
    driver answers, False never does, and any other object is used in its
    place (tests pass a fake).
    """
    nodes = read_numa_nodes(sys, proc)
    cpus = online_cpus(sys)
    return {
        "cpus": cpus,
        "numa_nodes": nodes,
        "cpu_info": read_cpus(sys, cpus, nodes),
        "pci": read_pci(sys, proc, nvml),
    }


# --- NUMA nodes and CPUs ----------------------------------------------------


def read_numa_nodes(sys: Path = Path("/sys"), proc: Path = Path("/proc")) -> list[NumaNode]:
    node_dir = sys / "devices/system/node"
    ranges = zone_pfn_ranges(_text(proc / "zoneinfo"))
    nodes = []
    # hostinfo.numa_nodes already falls back to one node 0 with every online
    # CPU on a kernel without NUMA; its memory is then the whole machine's.
    for node, cpus in sorted(numa_nodes(sys).items()):
        meminfo = node_dir / f"node{node}/meminfo" if node_dir.is_dir() else proc / "meminfo"
        found = MEMTOTAL_KB.search(_text(meminfo))
        memory = int(found.group(1)) * 1024 if found else 0
        nodes.append(NumaNode(node, cpus, memory, ranges.get(node, [])))
    return nodes


def zone_pfn_ranges(zoneinfo: str) -> dict[int, list[list[int]]]:
    """node -> merged [start, end) page-frame ranges of its zones.

    Each "Node N, zone X" section of /proc/zoneinfo has ``spanned`` pages
    from ``start_pfn:``. Empty zones (Movable, Device, node 1's DMA) print no
    start_pfn and span 0 pages: they are skipped. The span includes holes,
    which is what a page-frame -> node lookup wants.
    """
    spans: dict[int, list[tuple[int, int]]] = {}
    node, spanned = -1, 0
    for line in zoneinfo.splitlines():
        words = line.split()
        if line.startswith("Node "):  # "Node 0, zone   Normal"
            node, spanned = int(words[1].rstrip(",")), 0
        elif words[:1] == ["spanned"]:
            spanned = int(words[1])
        elif words[:1] == ["start_pfn:"] and spanned:
            start = int(words[1])
            spans.setdefault(node, []).append((start, start + spanned))
    return {n: _merge(r) for n, r in spans.items()}


def _merge(ranges: list[tuple[int, int]]) -> list[list[int]]:
    """Sorted ranges with adjacent or overlapping ones joined: DMA, DMA32 and
    Normal of one node usually make one range."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def read_cpus(sys: Path, cpus: list[int], nodes: list[NumaNode]) -> list[Cpu]:
    node_of = {cpu: n.node for n in nodes for cpu in n.cpus}
    info = []
    for cpu in cpus:
        topology = sys / f"devices/system/cpu/cpu{cpu}/topology"
        try:
            socket = int((topology / "physical_package_id").read_text())
            core = int((topology / "core_id").read_text())
            siblings = parse_cpu_list((topology / "thread_siblings_list").read_text())
        except FileNotFoundError:  # some containers and architectures hide topology/
            socket, core, siblings = -1, -1, [cpu]
        info.append(Cpu(cpu, node_of.get(cpu, -1), socket, core, siblings))
    return info


# --- PCI ----------------------------------------------------------------------


def read_pci(sys: Path = Path("/sys"), proc: Path = Path("/proc"), nvml: object = True) -> list[PciDevice]:
    """GPUs, NVMe controllers and NICs, each with its chain of upstream bridges."""
    links = sys / "bus/pci/devices"
    if not links.is_dir():  # no PCI at all (some VMs and containers)
        return []
    devices_root = (sys / "devices").resolve()
    minors = {address: minor for minor, address in gpu_minors(proc).items()}
    from_nvml = _nvml_gpus(nvml)
    found = []
    for link in sorted(links.iterdir()):
        path = link.resolve()  # ../../../devices/pci0000:80/0000:80:01.0/.../0000:83:00.0
        vendor, class_code = _hex(path / "vendor"), _hex(path / "class")
        kind = device_kind(vendor, class_code)
        # SR-IOV virtual functions share their physical function's link; listing
        # dozens of VFs per NIC would only repeat it.
        if kind is None or (path / "physfn").is_symlink():
            continue
        try:
            chain = path.relative_to(devices_root).parts
        except ValueError:  # sys/devices itself reached through another link
            chain = path.parts
        # Every PCI address above the device is a bridge: root port first. Other
        # components (pci0000:80 host bridges, Hyper-V's VMBUS GUIDs) are not.
        upstream = [part for part in chain[:-1] if PCI_ADDRESS.fullmatch(part)]
        address = link.name
        name = ""
        if kind == "nvme":
            name = _first_child(path, "nvme")
        elif kind == "nic":
            name = _first_child(path, "net")
        elif address in minors:
            name = f"nvidia{minors[address]}"
        gen = link_gen(_text(path / "current_link_speed"))
        width = int(_text(path / "current_link_width") or 0)
        if address in from_nvml:
            index, nvml_gen, nvml_width = from_nvml[address]
            name, gen, width = str(index), nvml_gen or gen, nvml_width or width
        numa_node = int(_text(path / "numa_node") or -1)
        found.append(PciDevice(address, kind, vendor, _hex(path / "device"), class_code, numa_node,
                               upstream, name, gen, width))
    return found


def device_kind(vendor: int, class_code: int) -> str | None:
    """The kind of device the rules care about ("gpu", "nvme", "nic"), else None."""
    if vendor == NVIDIA and class_code >> 16 == 0x03:  # VGA or 3D controller
        return "gpu"
    if class_code == CLASS_NVME:
        return "nvme"
    if class_code >> 16 == 0x02:
        return "nic"
    return None


def link_gen(speed: str) -> int:
    """'16.0 GT/s PCIe' -> 4; 0 for 'Unknown' (link down) or no file.

    This is the link's current state: idle GPUs often train down to 2.5 GT/s
    to save power, so a low generation is only suspicious under load."""
    try:
        return GT_PER_S_TO_GEN.get(float(speed.split()[0]), 0)
    except (IndexError, ValueError):
        return 0


def gpu_minors(proc: Path = Path("/proc")) -> dict[int, str]:
    """NVIDIA device minor (the N of /dev/nvidiaN) -> PCI address, from the
    driver's /proc/driver/nvidia/gpus/<address>/information."""
    minors = {}
    gpus = proc / "driver/nvidia/gpus"
    for info in sorted(gpus.glob("*/information")) if gpus.is_dir() else []:
        for line in _text(info).splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and value.strip().isdigit():
                minors[int(value)] = normalize_pci_address(info.parent.name)
    return minors


def _nvml_gpus(nvml: object) -> dict[str, tuple[int, int, int]]:
    """PCI address -> (NVML index, current link gen, width); {} without NVML."""
    if nvml is True:
        try:
            import pynvml as nvml  # nvidia-ml-py, optional
        except ImportError:
            return {}
    if not nvml:
        return {}
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()  # raises without libnvidia-ml or a loaded driver
    except error:
        return {}
    gpus = {}
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                address = normalize_pci_address(nvml.nvmlDeviceGetPciInfo(handle).busId)
            except error:  # a GPU that fell off the bus still counts
                continue
            gpus[address] = (index, _nvml_int(error, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                             _nvml_int(error, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle))
    finally:
        nvml.nvmlShutdown()
    return gpus


def _nvml_int(error: type, call, handle) -> int:
    try:
        return int(call(handle))
    except error:  # not supported (some vGPU and MIG setups)
        return 0


# --- processes ----------------------------------------------------------------

GPU_NODE = re.compile(r"nvidia(\d+)")  # not nvidiactl, nvidia-uvm, nvidia-caps/...


def process_gpus(pid: int, proc: Path = Path("/proc"), topo: Topology | None = None,
                 dev: Path = Path("/dev")) -> tuple[list[str], str]:
    """PCI addresses of the GPUs ``pid`` has open, and its CUDA_VISIBLE_DEVICES.

    A CUDA process holds /dev/nvidia<minor> open for each GPU it uses (beside
    nvidiactl and nvidia-uvm). The link target is a path as the target process
    names it, so it is matched by text, never opened: ``dev`` is where device
    nodes are named. The minor maps to a GPU through the driver's procfs; where
    that is hidden (some containers), through ``topo``'s GPU names, assuming
    NVML index == minor, which holds when the driver probed GPUs in PCI order.
    Missing or unreadable (not root) process: ([], "").

    CUDA_VISIBLE_DEVICES is reported as is: its indices follow CUDA's order,
    which is PCI order only with CUDA_DEVICE_ORDER=PCI_BUS_ID.
    """
    base = proc / str(pid)
    try:
        fds = os.listdir(base / "fd")
        environ = (base / "environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return [], ""
    minors = set()
    for fd in fds:
        try:
            target = os.readlink(base / "fd" / fd)
        except OSError:  # closed since listdir
            continue
        found = GPU_NODE.fullmatch(os.path.basename(target))
        if found and os.path.dirname(target) == str(dev):
            minors.add(int(found.group(1)))
    by_minor = gpu_minors(proc)
    for gpu in topo.pci if topo is not None else []:
        # read_topology names a GPU "<NVML index>" or "nvidia<minor>"
        minor = gpu.name.removeprefix("nvidia")
        if gpu.kind == "gpu" and minor.isdigit():
            by_minor.setdefault(int(minor), gpu.address)
    gpus = sorted({by_minor[m] for m in minors if m in by_minor})
    visible = next((var.split(b"=", 1)[1] for var in environ.split(b"\0")
                    if var.startswith(b"CUDA_VISIBLE_DEVICES=")), b"")
    return gpus, visible.decode(errors="replace")


# --- small readers --------------------------------------------------------------

def _text(path: Path) -> str:
    """A sysfs/procfs file's text, "" when it is absent or unreadable: attributes
    come and go with kernel version, and some fail to read (EIO) while a
    device is powered down."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _hex(path: Path) -> int:
    return int(_text(path) or "0", 16)  # "0x10de", "0x030200"


def _first_child(path: Path, subsystem: str) -> str:
    """nvme0 from <dev>/nvme/nvme0, eth0 from <dev>/net/eth0. virtio puts the
    class directory one level down (<dev>/virtio2/net/eth0)."""
    children = sorted(path.glob(f"{subsystem}/*")) or sorted(path.glob(f"*/{subsystem}/*"))
    return children[0].name if children else ""
