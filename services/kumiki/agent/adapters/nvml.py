"""NVML source: the GPU inventory at start and one sample per GPU (and per MIG instance) per tick.

Every NVML call goes through `_call`: NOT_SUPPORTED leaves the field unset (and is remembered, so
the operator can see what this hardware lacks); any other NVML error is logged once per GPU and
field, counted, and also leaves the field unset. A sampling tick never raises for a single field.
"""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from kumiki.agent.core import (
    GpuDevice,
    GpuInventory,
    GpuPair,
    GpuSample,
    MigInstance,
    SampleFields,
    cuda_version_string,
    mig_profile,
    nvlink_counts,
    power_watts,
    topology_name,
)

log = logging.getLogger(__name__)

SOURCE = "nvml"

T = TypeVar("T")

# Most events a tick drains, so a storm of XIDs cannot stall sampling.
MAX_EVENTS_PER_TICK = 256
# NVML reports "no instance" in event data with all bits set.
_NO_INSTANCE = 0xFFFFFFFF
# Answers that mean "this driver has no nvmlDeviceGetMemoryInfo_v2": use v1 from then on.
_NO_MEMORY_V2 = (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised (no driver, no library): the agent cannot start on NVML."""


def _handle_key(handle: Any) -> int:
    """Handles are opaque pointers; their address identifies the device across calls."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Mig:
    handle: Any
    gpu_instance_id: int


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    mig_enabled: bool
    model: str | None = None
    migs: list[_Mig] = field(default_factory=list)
    events_registered: bool = False


class NvmlSource:
    """Reads one node's GPUs through pynvml; synchronous (NVML calls are short and blocking)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.errors: Counter[str] = Counter()
        # (GPU index, field) the hardware or driver does not offer; index -1 for system-wide calls.
        self.unsupported: set[tuple[int, str]] = set()
        self._logged: set[tuple[int, str, int]] = set()
        self._gpus: list[_Gpu] = []
        self._event_set: Any = None
        self._open = False
        self._memory_v2 = True

    # -- error policy ---------------------------------------------------------------------------

    def _call(self, gpu: int, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as error:
            code = int(getattr(error, "value", -1))
            if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add((gpu, name))
                return None
            self.errors[name] += 1
            if (gpu, name, code) not in self._logged:
                self._logged.add((gpu, name, code))
                where = "" if gpu < 0 else f" on GPU {gpu}"
                log.warning("NVML %s%s failed: %s (code %d); field left unset", name, where, error, code)
            return None

    def _memory(self, gpu: int, name: str, handle: Any) -> Any:
        """Memory info, v2 where the driver has it.

        v1's `used` includes the driver's reserved memory on recent drivers; v2 keeps it apart, as
        DCGM's FB_USED does, so both sources mean the same thing by "used".
        """
        if self._memory_v2:
            try:
                return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except pynvml.NVMLError as error:
                code = getattr(error, "value", None)
                if code in _NO_MEMORY_V2:
                    log.info("nvmlDeviceGetMemoryInfo_v2 unavailable (%s); using v1", error)
                    self._memory_v2 = False
                elif code != pynvml.NVML_ERROR_NOT_SUPPORTED:
                    return self._call(gpu, name, _raise, error)
        return self._call(gpu, name, pynvml.nvmlDeviceGetMemoryInfo, handle)

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self, now: float) -> GpuInventory:
        """Initialise NVML, read the inventory and subscribe to XID events where supported."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML could not be initialised: {error}") from error
        self._open = True
        try:
            return self._inventory(now)
        except BaseException:
            self.close()
            raise

    def reopen(self, now: float) -> GpuInventory:
        """Shut NVML down and open it again: a MIG reconfiguration leaves the old MIG handles stale."""
        self.close()
        return self.open(now)

    def close(self) -> None:
        if not self._open:
            return
        if self._event_set is not None:
            self._call(-1, "events", pynvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._open = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.warning("nvmlShutdown failed: %s", error)

    # -- inventory ------------------------------------------------------------------------------

    def _inventory(self, now: float) -> GpuInventory:
        driver = self._call(-1, "driver_version", pynvml.nvmlSystemGetDriverVersion)
        cuda = self._call(-1, "cuda_version", pynvml.nvmlSystemGetCudaDriverVersion)
        count = pynvml.nvmlDeviceGetCount()
        devices: list[GpuDevice] = []
        bus_ids: dict[int, str | None] = {}
        remotes: dict[int, list[str]] = {}
        self._gpus = []
        for index in range(count):
            handle = self._call(index, "handle", pynvml.nvmlDeviceGetHandleByIndex, index)
            uuid = None if handle is None else self._call(index, "uuid", pynvml.nvmlDeviceGetUUID, handle)
            if handle is None or uuid is None:
                # Without a UUID a GPU cannot be named in any sample: leave it out, loudly.
                log.error("GPU %d has no readable handle or UUID; it is not sampled", index)
                self.errors["gpu_skipped"] += 1
                continue
            device, gpu, active_remotes = self._read_gpu(index, handle, _text(uuid))
            devices.append(device)
            self._gpus.append(gpu)
            bus_ids[index] = device.pci_bus_id
            remotes[index] = active_remotes
        self._subscribe_events()
        return GpuInventory(
            node=self.node,
            collected_at=now,
            driver_version=None if driver is None else _text(driver),
            cuda_driver_version=None if cuda is None else cuda_version_string(int(cuda)),
            gpus=tuple(devices),
            pairs=self._pairs(bus_ids, remotes),
        )

    def _read_gpu(self, index: int, handle: Any, uuid: str) -> tuple[GpuDevice, _Gpu, list[str]]:
        name = self._call(index, "name", pynvml.nvmlDeviceGetName, handle)
        memory = self._memory(index, "memory", handle)
        pci = self._call(index, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
        modes = self._call(index, "mig_mode", pynvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = None if modes is None else modes[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        gpu = _Gpu(
            index=index,
            handle=handle,
            uuid=uuid,
            mig_enabled=bool(mig_enabled),
            model=None if name is None else _text(name),
        )
        instances: list[MigInstance] = []
        if mig_enabled:
            instances = self._read_migs(gpu)
        active_remotes = self._nvlink_remotes(index, handle)
        device = GpuDevice(
            index=index,
            uuid=uuid,
            name=None if name is None else _text(name),
            memory_total_bytes=None if memory is None else int(memory.total),
            pci_bus_id=None if pci is None else _text(pci.busId),
            mig_enabled=mig_enabled,
            mig_instances=tuple(instances),
            nvlinks_active=None if active_remotes is None else len(active_remotes),
        )
        return device, gpu, active_remotes or []

    def _read_migs(self, gpu: _Gpu) -> list[MigInstance]:
        index, handle = gpu.index, gpu.handle
        slots = self._call(index, "mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        instances: list[MigInstance] = []
        for slot in range(int(slots)):
            try:
                mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as error:
                if getattr(error, "value", None) != pynvml.NVML_ERROR_NOT_FOUND:
                    self._call(index, "mig_handle", _raise, error)
                continue  # NOT_FOUND: an empty slot, the normal case
            gi = self._call(index, "mig_gpu_instance", pynvml.nvmlDeviceGetGpuInstanceId, mig_handle)
            if gi is None:
                continue
            ci = self._call(index, "mig_compute_instance", pynvml.nvmlDeviceGetComputeInstanceId, mig_handle)
            mig_uuid = self._call(index, "mig_uuid", pynvml.nvmlDeviceGetUUID, mig_handle)
            mig_name = self._call(index, "mig_name", pynvml.nvmlDeviceGetName, mig_handle)
            memory = self._memory(index, "mig_memory", mig_handle)
            attributes = self._call(index, "mig_attributes", pynvml.nvmlDeviceGetAttributes, mig_handle)
            # The GPU-instance query needs a privileged agent on real drivers (NO_PERMISSION else).
            instance = self._call(index, "mig_placement", pynvml.nvmlDeviceGetGpuInstanceById, handle, gi)
            info = (
                None
                if instance is None
                else self._call(index, "mig_placement", pynvml.nvmlGpuInstanceGetInfo, instance)
            )
            instances.append(
                MigInstance(
                    gpu_instance_id=int(gi),
                    compute_instance_id=None if ci is None else int(ci),
                    uuid=None if mig_uuid is None else _text(mig_uuid),
                    profile=mig_profile(
                        None if mig_name is None else _text(mig_name),
                        None if attributes is None else int(attributes.gpuInstanceSliceCount),
                        None if attributes is None else int(attributes.memorySizeMB),
                    ),
                    memory_total_bytes=None if memory is None else int(memory.total),
                    placement_start=None if info is None else int(info.placement.start),
                    placement_size=None if info is None else int(info.placement.size),
                )
            )
            gpu.migs.append(_Mig(handle=mig_handle, gpu_instance_id=int(gi)))
        return instances

    def _nvlink_remotes(self, index: int, handle: Any) -> list[str] | None:
        """PCI addresses at the far end of each active NVLink; None where the GPU has no NVLink."""
        remotes: list[str] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as error:
                code = getattr(error, "value", None)
                if code == pynvml.NVML_ERROR_NOT_SUPPORTED and link == 0:
                    self.unsupported.add((index, "nvlink"))
                    return None
                if code not in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED):
                    self._call(index, "nvlink", _raise, error)
                break  # past the last link this GPU has
            if active != pynvml.NVML_FEATURE_ENABLED:
                continue
            pci = self._call(index, "nvlink_remote", pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if pci is not None:
                remotes.append(_text(pci.busId))
        return remotes

    def _pairs(self, bus_ids: dict[int, str | None], remotes: dict[int, list[str]]) -> tuple[GpuPair, ...]:
        links = nvlink_counts(bus_ids, remotes)
        pairs: list[GpuPair] = []
        for position, first in enumerate(self._gpus):
            for second in self._gpus[position + 1 :]:
                level = self._call(
                    first.index, "topology", pynvml.nvmlDeviceGetTopologyCommonAncestor, first.handle, second.handle
                )
                p2p = self._call(
                    first.index,
                    "p2p",
                    pynvml.nvmlDeviceGetP2PStatus,
                    first.handle,
                    second.handle,
                    pynvml.NVML_P2P_CAPS_INDEX_NVLINK,
                )
                pairs.append(
                    GpuPair(
                        a=first.index,
                        b=second.index,
                        topology=None if level is None else topology_name(int(level)),
                        nvlinks=links.get((first.index, second.index), 0),
                        nvlink_p2p=None if p2p is None else p2p == pynvml.NVML_P2P_STATUS_OK,
                    )
                )
        return tuple(pairs)

    def _subscribe_events(self) -> None:
        """XID events where the driver offers them; many containers and vGPUs do not."""
        event_set = self._call(-1, "events", pynvml.nvmlEventSetCreate)
        if event_set is None:
            return
        self._event_set = event_set
        for gpu in self._gpus:
            supported = self._call(gpu.index, "events", pynvml.nvmlDeviceGetSupportedEventTypes, gpu.handle)
            if not supported or not int(supported) & pynvml.nvmlEventTypeXidCriticalError:
                self.unsupported.add((gpu.index, "events"))
                continue
            registered = self._call(gpu.index, "events", _register, gpu.handle, event_set)
            gpu.events_registered = registered is not None

    # -- sampling -------------------------------------------------------------------------------

    def sample(self, timestamp: float) -> list[GpuSample]:
        """One sample per GPU, then one per MIG instance of it, all stamped `timestamp`."""
        if not self._open:
            raise RuntimeError("NvmlSource.sample before open")
        xids = self._drain_events()
        samples: list[GpuSample] = []
        for gpu in self._gpus:
            known = {mig.gpu_instance_id for mig in gpu.migs}
            for key in [key for key in xids if key[0] == gpu.index and key[1] not in known | {None}]:
                # An XID for an instance this agent does not know still belongs to the GPU.
                xids[(gpu.index, None)] = xids.get((gpu.index, None), ()) + xids.pop(key)
            samples.append(
                GpuSample(
                    node=self.node,
                    gpu_uuid=gpu.uuid,
                    gpu_index=gpu.index,
                    mig_instance_id=None,
                    timestamp=timestamp,
                    fields=self._gpu_fields(gpu, xids.get((gpu.index, None), ())),
                    model=gpu.model,
                    source=SOURCE,
                )
            )
            for mig in gpu.migs:
                samples.append(
                    GpuSample(
                        node=self.node,
                        gpu_uuid=gpu.uuid,
                        gpu_index=gpu.index,
                        mig_instance_id=mig.gpu_instance_id,
                        timestamp=timestamp,
                        fields=self._mig_fields(gpu.index, mig, xids.get((gpu.index, mig.gpu_instance_id), ())),
                        model=gpu.model,
                        source=SOURCE,
                    )
                )
        return samples

    def _gpu_fields(self, gpu: _Gpu, xids: tuple[int, ...]) -> SampleFields:
        index, handle = gpu.index, gpu.handle
        utilisation = self._call(index, "utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._memory(index, "memory", handle)
        power = self._call(index, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
        temperature = self._call(
            index, "temperature", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
        )
        corrected = self._call(
            index,
            "ecc",
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        uncorrected = self._call(
            index,
            "ecc",
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return SampleFields(
            gpu_util_pct=None if utilisation is None else float(utilisation.gpu),
            memory_util_pct=None if utilisation is None else float(utilisation.memory),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_w=None if power is None else power_watts(int(power)),
            temperature_c=None if temperature is None else float(temperature),
            ecc_corrected_volatile=None if corrected is None else int(corrected),
            ecc_uncorrected_volatile=None if uncorrected is None else int(uncorrected),
            xid_errors=xids,
        )

    def _mig_fields(self, index: int, mig: _Mig, xids: tuple[int, ...]) -> SampleFields:
        # NVML gives a MIG device its memory; utilisation is NOT_SUPPORTED there on real drivers
        # (DCGM's profiling counters are the per-instance activity source), but ask anyway.
        utilisation = self._call(index, "mig_utilization", pynvml.nvmlDeviceGetUtilizationRates, mig.handle)
        memory = self._memory(index, "mig_memory", mig.handle)
        return SampleFields(
            gpu_util_pct=None if utilisation is None else float(utilisation.gpu),
            memory_util_pct=None if utilisation is None else float(utilisation.memory),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            xid_errors=xids,
        )

    def _drain_events(self) -> dict[tuple[int, int | None], tuple[int, ...]]:
        """XIDs since the last tick, per (GPU index, GPU instance id or None)."""
        if self._event_set is None or not any(gpu.events_registered for gpu in self._gpus):
            return {}
        by_handle = {_handle_key(gpu.handle): gpu.index for gpu in self._gpus}
        found: dict[tuple[int, int | None], list[int]] = {}
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                event = pynvml.nvmlEventSetWait(self._event_set, 0)
            except pynvml.NVMLError as error:
                if getattr(error, "value", None) != pynvml.NVML_ERROR_TIMEOUT:
                    self._call(-1, "events", _raise, error)
                break
            if not int(event.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = by_handle.get(_handle_key(event.device))
            if index is None:
                self.errors["event_unknown_device"] += 1
                continue
            instance = int(event.gpuInstanceId)
            key = (index, None if instance == _NO_INSTANCE else instance)
            found.setdefault(key, []).append(int(event.eventData))
        return {key: tuple(codes) for key, codes in found.items()}


def _raise(error: BaseException) -> None:
    """Lets an error caught elsewhere pass through `_call`'s counting and logging."""
    raise error


def _register(handle: Any, event_set: Any) -> bool:
    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    return True
