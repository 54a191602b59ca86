import os
import subprocess
LDM=64
def ptx(shape, layout, ct):
    nreg = 4 if ct=='f16' else 8
    rty = 'b32' if ct=='f16' else 'f32'
    regs=",".join(f"%r{i}" for i in range(nreg))
    loads="\n".join(f"  ld.global.{rty} %r{i}, [%rd4+{4*i}];" for i in range(nreg))
    return f""".version 6.4
.target sm_70
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout){{
  .reg .u64 %rd<6>; .reg .u32 %l<3>; .reg .{rty} %r<{nreg}>;
  ld.param.u64 %rd1, [pin]; ld.param.u64 %rd2, [pout];
  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %l0, %laneid; mul.wide.u32 %rd3, %l0, {4*nreg}; add.u64 %rd4, %rd1, %rd3;
{loads}
  wmma.store.d.sync.aligned.{layout}.{shape}.global.{ct} [%rd2], {{{regs}}}, {LDM};
  ret;
}}
"""
for shape in ("m16n16k16","m32n8k16","m8n32k16"):
  for layout in ("row","col"):
    for ct in ("f16","f32"):
      n=f"st/{shape}_d_{layout}_{ct}"
      open(n+".ptx","w").write(ptx(shape,layout,ct))
      r=subprocess.run([os.environ.get("PTXAS","/tmp/tools/ptxas"),"-arch=sm_70",n+".ptx","-o",n+".cubin"],capture_output=True,text=True)
      if r.returncode: print(n,r.stderr); continue
      open(n+".sass","w").write(subprocess.run([os.environ.get("NVDISASM","/tmp/tools/nvdisasm"),"-c",n+".cubin"],capture_output=True,text=True).stdout)
