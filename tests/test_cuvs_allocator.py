"""cuVS's temporaries through torch's caching allocator (csrc/cuda/rmm_route.hpp, csrc/cuda/rmm_torch.cpp).

Without a GPU (needs a build with cuVS and the librmm wheel installed): RMM's per-device map written by
libdihal_rmm_torch.so is the one librmm.so holds (the loader merge the route depends on), a routed device's
allocations reach torch.cuda.caching_allocator_alloc (on a CPU torch they fail with torch's own reason) and an
unrouted device keeps RMM's cudaMalloc. On a GPU (bench/gpu_check.sh, DIHAL_REQUIRE_GPU=1): a cuVS kNN's
temporaries are torch-allocated, torch's reserved memory stays within the bound and nothing is cudaMalloc'ed
beside torch's cache."""

from __future__ import annotations

import ctypes
import importlib.util
import os

import pytest

from dihal_fast import _native

torch = pytest.importorskip("torch")

REQUIRE_GPU = os.environ.get("DIHAL_REQUIRE_GPU") == "1"
# RMM's per-device map (a static local of the exported inline rmm::mr::detail::get_ref_map of RMM 26.10's ABI
# namespace): STB_GNU_UNIQUE, so every library defining it shares librmm.so's object.
RMM_MAP_SYMBOL = "_ZZN3rmm10_RMM_26_102mr6detail11get_ref_mapEvE21device_id_to_resource"
MIB = 1 << 20


def _cuda_module():
    module, reason = _native._load("_cuda")
    if module is None:
        pytest.skip(f"the CUDA module is not compiled into this build ({reason})")
    if "cuvs_allocator" not in module.build_info():
        pytest.skip("this CUDA module was built before the cuVS allocator route (rebuild it)")
    return module


def _routed_module():
    """The CUDA module with the route compiled in and librmm.so loaded (as libcuvs.load_library does)."""
    module = _cuda_module()
    allocator = module.build_info()["cuvs_allocator"]
    if importlib.util.find_spec("librmm") is None:
        pytest.skip("no librmm wheel installed (pip install librmm-cu13==26.10.* or librmm-cu12==26.10.*)")
    if not allocator.startswith("torch"):
        reason = f"this build's cuVS does not allocate through torch ({allocator!r})"
        if REQUIRE_GPU:  # bench/gpu_check.sh builds with the RAPIDS wheels installed: the route must be in
            pytest.fail(reason)
        pytest.skip(reason)
    import librmm

    librmm.load_library()
    return module


def _shim(module):
    lib = ctypes.CDLL(module.rmm_route_library(), ctypes.RTLD_LOCAL)
    lib.dihal_rmm_map_address.restype = ctypes.c_void_p
    lib.dihal_rmm_allocate_probe.restype = ctypes.c_void_p
    lib.dihal_rmm_allocate_probe.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def _probe(lib, device: int, nbytes: int) -> tuple[int | None, str]:
    """One allocation (freed at once) through RMM's resource of ``device``: (pointer or None, RMM's error)."""
    message = ctypes.create_string_buffer(512)
    ptr = lib.dihal_rmm_allocate_probe(device, nbytes, message, len(message))
    return ptr, message.value.decode()


def test_build_info_says_where_cuvs_allocates():
    info = _cuda_module().build_info()
    if not info["cuvs_compiled"]:
        assert info["cuvs_allocator"] == ""
    else:
        assert info["cuvs_allocator"].startswith(("torch (", "rmm default (")), info["cuvs_allocator"]
        from dihal_fast import build_info

        assert build_info()["backends"]["cuvs"]["allocator"] == info["cuvs_allocator"]


def test_rmm_map_is_the_one_librmm_holds():
    module = _routed_module()
    import librmm

    rmm = ctypes.CDLL(os.path.join(os.path.dirname(librmm.__file__), "lib64", "librmm.so"), ctypes.RTLD_LOCAL)
    in_librmm = ctypes.addressof(ctypes.c_char.in_dll(rmm, RMM_MAP_SYMBOL))
    assert _shim(module).dihal_rmm_map_address() == in_librmm


def test_routed_device_allocates_through_torch():
    module = _routed_module()
    lib = _shim(module)
    assert module.route_cuvs_allocator(0) == "torch"
    assert module.route_cuvs_allocator(0) == "torch"  # once per device, then the same answer
    assert module.cuvs_allocator_routes()[0] == "torch"
    before = module.cuvs_allocator_stats()
    if not torch.cuda.is_available():
        ptr, message = _probe(lib, 0, MIB)
        assert ptr is None
        assert "torch's caching allocator" in message and ("CUDA" in message or "cuda" in message), message
        assert module.cuvs_allocator_stats()["allocations"] == before["allocations"]
        return
    torch_before = torch.cuda.memory_stats(0).get("allocation.all.allocated", 0)
    ptr, message = _probe(lib, 0, 3 * MIB)
    assert ptr, message
    assert ptr % 256 == 0
    after = module.cuvs_allocator_stats()
    assert after["allocations"] == before["allocations"] + 1
    assert after["live_bytes"] == before["live_bytes"]  # freed again
    assert torch.cuda.memory_stats(0)["allocation.all.allocated"] == torch_before + 1


def test_unrouted_device_keeps_rmm_default():
    module = _routed_module()
    lib = _shim(module)
    device = 63  # never routed (no cuVS call reaches device 63)
    assert device not in module.cuvs_allocator_routes()
    before = module.cuvs_allocator_stats()["allocations"]
    _, message = _probe(lib, device, MIB)
    assert "torch" not in message
    assert module.cuvs_allocator_stats()["allocations"] == before


# ---------------------------------------------------------------- on a GPU (bench/gpu_check.sh)
def _cuvs_backend():
    from dihal_fast.geometry.backends import get_backend

    try:
        return get_backend("cuvs")
    except _native.BackendUnavailable as exc:
        if REQUIRE_GPU:
            pytest.fail(f"DIHAL_REQUIRE_GPU=1 but backend='cuvs' cannot run: {exc}")
        pytest.skip(f"backend='cuvs' cannot run here: {exc}")


def test_cuvs_knn_temporaries_are_torch_allocated():
    backend = _cuvs_backend()
    module = _routed_module()
    n, D, k = 60_000, 512, 10
    device = torch.device("cuda", 0)
    X = torch.randn(n, D, device=device, generator=torch.Generator(device).manual_seed(0))
    backend.knn_device(X[:4096], k)  # first use: cuVS resources, cuBLAS handles (their own cudaMalloc), the route
    assert module.cuvs_allocator_routes()[0] == "torch"
    torch.cuda.synchronize(device)
    free0, _ = torch.cuda.mem_get_info(device)
    reserved0, allocated0 = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    module.cuvs_allocator_stats(reset_peak=True)
    start = module.cuvs_allocator_stats()  # what cuVS still holds from the first call counts in both peaks' bases
    calls0, live0 = start["allocations"], start["live_bytes"]

    idx, d2 = backend.knn_device(X, k)
    torch.cuda.synchronize(device)
    route = module.cuvs_allocator_stats()
    free1, _ = torch.cuda.mem_get_info(device)
    grown = torch.cuda.max_memory_reserved(device) - reserved0
    peak = torch.cuda.max_memory_allocated(device) - allocated0
    workspace = module.knn_workspace(n, D, k, backend._codes[X.dtype], True)
    outputs = idx.numel() * (idx.element_size() + d2.element_size()) + 4 * n
    outside = (free0 - free1) - (torch.cuda.memory_reserved(device) - reserved0)
    route_calls, route_peak = route["allocations"] - calls0, (route["peak_bytes"] - live0) / MIB
    print(
        f"cuVS kNN n={n} D={D} k={k}: route {route_calls} allocations, peak {route_peak:.1f} MiB; torch peak"
        f" allocated +{peak / MIB:.1f} MiB, reserved +{grown / MIB:.1f} MiB (workspace {workspace / MIB:.1f} MiB,"
        f" outputs {outputs / MIB:.1f} MiB); device memory outside torch {outside / MIB:+.1f} MiB"
    )
    # cuVS's index and search temporaries went through torch and are inside what torch counts as allocated
    assert route["allocations"] > calls0 and route["peak_bytes"] - live0 > 4 * n
    assert route["peak_bytes"] - live0 <= peak
    # the expected bound: torch reserves what it hands out (our workspace, the outputs, the fallback's tiles and
    # cuVS's temporaries, all in `peak`) plus its block rounding (2 MiB blocks, 20 MiB segments), no second pool
    assert grown <= peak + 128 * MIB
    # nothing cudaMalloc'ed beside torch's cache during the call (2 MiB driver granularity, a little slack)
    assert outside <= 16 * MIB
