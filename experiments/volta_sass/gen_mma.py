import os
import subprocess
def ptx(shape, al, bl, dt, ct):
    nc = 8 if ct=='f32' else 4; nd = 8 if dt=='f32' else 4
    cty = 'f32' if ct=='f32' else 'b32'; dty='f32' if dt=='f32' else 'b32'
    a=",".join(f"%a{i}" for i in range(8)); b=",".join(f"%b{i}" for i in range(8))
    c=",".join(f"%c{i}" for i in range(nc)); d=",".join(f"%d{i}" for i in range(nd))
    lda="\n".join(f"  ld.global.b32 %a{i}, [%rd4+{4*i}];" for i in range(8))
    ldb="\n".join(f"  ld.global.b32 %b{i}, [%rd4+{32+4*i}];" for i in range(8))
    ldc="\n".join(f"  ld.global.{cty} %c{i}, [%rd4+{64+4*i}];" for i in range(nc))
    std="\n".join(f"  st.global.{dty} [%rd5+{4*i}], %d{i};" for i in range(nd))
    return f""".version 6.4
.target sm_70
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout){{
  .reg .u64 %rd<7>; .reg .u32 %l<3>; .reg .b32 %a<8>; .reg .b32 %b<8>; .reg .{cty} %c<{nc}>; .reg .{dty} %d<{nd}>;
  ld.param.u64 %rd1, [pin]; ld.param.u64 %rd2, [pout];
  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %l0, %laneid; mul.wide.u32 %rd3, %l0, 128; add.u64 %rd4, %rd1, %rd3; add.u64 %rd5, %rd2, %rd3;
{lda}
{ldb}
{ldc}
  wmma.mma.sync.aligned.{al}.{bl}.{shape}.{dt}.{ct} {{{d}}}, {{{a}}}, {{{b}}}, {{{c}}};
{std}
  ret;
}}
"""
for shape in ("m16n16k16","m32n8k16","m8n32k16"):
  for dt,ct in (("f32","f32"),("f16","f16")):
    for al,bl in (("row","col"),("col","row")):
      n=f"mma/{shape}_{al}_{bl}_{dt}{ct}"
      open(n+".ptx","w").write(ptx(shape,al,bl,dt,ct))
      r=subprocess.run([os.environ.get("PTXAS","/tmp/tools/ptxas"),"-arch=sm_70",n+".ptx","-o",n+".cubin"],capture_output=True,text=True)
      if r.returncode: print(n,r.stderr); continue
      open(n+".sass","w").write(subprocess.run([os.environ.get("NVDISASM","/tmp/tools/nvdisasm"),"-c",n+".cubin"],capture_output=True,text=True).stdout)
