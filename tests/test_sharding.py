"""GEMMs and register-level programs sharded over several devices: the same bits as on one device,
and the work split (each device runs the kernel on its own rows). Runs in a subprocess with two
CPU devices (``--xla_force_host_platform_device_count=2``), and with two GPUs where the machine
has them (each GPU runs the CUDA kernel on its shard)."""
from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import pytest

from conftest import run_on_devices

SCRIPT = textwrap.dedent(r"""
    import json, re
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tcemu

    assert len(jax.devices()) == 2
    mesh = Mesh(np.array(jax.devices()), ("d",))
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
    same = lambda x, y: bool(np.array_equal(np.atleast_1d(np.asarray(x)).view(np.uint8),
                                            np.atleast_1d(np.asarray(y)).view(np.uint8)))
    rng = np.random.default_rng(0)
    out = {}

    def kernels(fn, *args):  # the shapes of the kernel calls' results on each device, and any gathers
        hlo = fn.lower(*args).compile().as_text()
        return ([re.search(r"f32\[([0-9,]+)\]", line).group(1) for line in hlo.splitlines()
                 if 'custom_call_target="tcemu_blockfma' in line], "all-gather" in hlo)

    cfg = tcemu.GemmConfig(arch="H100", instruction="wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
    mm = jax.jit(lambda a, b: tcemu.matmul(a, b, config=cfg))
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 48)).astype(np.float32)
    ref = mm(a, b)
    for name, sa, sb in [("rows", P("d", None), P()), ("cols", P(), P(None, "d")), ("k", P(None, "d"), P("d", None))]:
        A, B = put(a, sa), put(b, sb)
        got = mm(A, B)
        out[name] = dict(same=same(got, ref), spec=str(got.sharding.spec), kernels=kernels(mm, A, B)[0])
    a3 = rng.standard_normal((4, 16, 32)).astype(np.float32)
    b3 = rng.standard_normal((4, 32, 16)).astype(np.float32)
    got = mm(put(a3, P("d")), put(b3, P("d")))
    out["batched"] = dict(same=same(got, mm(a3, b3)), spec=str(got.sharding.spec))

    nv = tcemu.GemmConfig(arch="RTX5090", instruction="mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4"
                          ".block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3")
    f = jax.jit(lambda a, b: tcemu.matmul(a, b, config=nv))
    a4 = rng.standard_normal((32, 128)).astype(np.float32)
    b4 = rng.standard_normal((128, 32)).astype(np.float32)
    out["nvfp4"] = dict(same=same(f(put(a4, P("d", None)), b4), f(a4, b4)))

    base = tcemu.GemmConfig(arch="H100", instruction="mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    dcfg = base.replace(grad_lhs=base, grad_rhs=base)
    dn = (((1,), (0,)), ((), ()))
    def loss(w, x, y):
        h = jax.nn.relu(tcemu.dot_general(x, w[0], dn, config=dcfg))
        return jnp.sum((tcemu.dot_general(h, w[1], dn, config=dcfg) - y) ** 2)
    grad = jax.jit(jax.grad(loss))
    w = (rng.standard_normal((32, 32)).astype(np.float32) / 8, rng.standard_normal((32, 16)).astype(np.float32) / 8)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    y = rng.standard_normal((64, 16)).astype(np.float32)
    g1 = grad(w, x, y)
    g2 = grad(w, put(x, P("d", None)), put(y, P("d", None)))
    out["train_grads"] = dict(same=all(same(p, q) for p, q in zip(g1, g2)))

    key = jax.random.key(1)
    sto = tcemu.GemmConfig(arch="H100", instruction="mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                           model=tcemu.numerics("H100").bf16.replace(rounding="stochastic"))
    fs = jax.jit(lambda a, b: tcemu.matmul(a, b, config=sto, key=key))
    out["stochastic"] = dict(same=same(fs(put(a, P("d", None)), b), fs(a, b)))

    ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    ld_b = tcemu.ptx("wmma.load.b.sync.aligned.col.m16n16k16.f16", arch="sm_90")
    mma = tcemu.ptx("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", arch="sm_90")
    st = tcemu.ptx("wmma.store.d.sync.aligned.row.m16n16k16.f32", arch="sm_90")
    def warp(mem):
        r = ld_a(tcemu.regfile(32), mem, dst=range(0, 8), p=0)
        r = ld_b(r, mem, dst=range(8, 16), p=512)
        r = mma(r, d=range(16, 24), a=range(0, 8), b=range(8, 16), c=range(24, 32))
        return st(mem, r, src=range(16, 24), p=1024)
    mem = np.zeros((8, 2048), np.uint8)
    mem[:, :1024] = rng.standard_normal((8, 512)).astype(np.float16).view(np.uint8)
    vw = jax.jit(jax.vmap(warp))
    got = vw(put(mem, P("d", None)))
    out["warps"] = dict(same=same(got, vw(mem)), spec=str(got.sharding.spec),
                        kernels=kernels(vw, put(mem, P("d", None))),
                        replicated=kernels(vw, mem))  # not sharded: every device runs every warp
    print("RESULT" + json.dumps(out))
""")


def _two_gpus() -> bool:
    """Whether this machine has two NVIDIA GPUs (asked of nvidia-smi, so that this process does
    not take GPU memory that the subprocess needs)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout
    return listing.count("GPU ") >= 2


@pytest.mark.parametrize("platform", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _two_gpus(), reason="needs two GPUs"))])
def test_sharded_over_two_devices_same_bits_and_split(platform):
    proc = run_on_devices(SCRIPT, 2, platform=platform, timeout=900, CUDA_VISIBLE_DEVICES="0,1",
                          XLA_PYTHON_CLIENT_PREALLOCATE="false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert all(v["same"] for v in out.values()), out
    assert out["rows"]["spec"].startswith("P('d'") and out["cols"]["spec"] == "P(None, 'd')"
    assert out["batched"]["spec"].startswith("P('d'") and out["warps"]["spec"].startswith("P('d'")
    # each device's kernel computes half the outputs: 32 of 64 rows, or 24 of 48 columns; with K
    # sharded, the freed mesh axis splits the rows
    assert out["rows"]["kernels"] == ["1,32,48"], out["rows"]
    assert out["cols"]["kernels"] == ["1,64,24"], out["cols"]
    assert out["k"]["kernels"] == ["1,32,48"], out["k"]
    # the vmapped wmma program, nothing gathered: on the CPU each device's kernel call runs its 4 of
    # the 8 warps (the GPU kernel runs GEMMs only: single MMAs are XLA's own ops there)
    cpu = platform == "cpu"
    assert out["warps"]["kernels"] == [["4,1,16,16"] if cpu else [], False], out["warps"]
    assert out["warps"]["replicated"] == [["8,1,16,16"] if cpu else [], False], out["warps"]
