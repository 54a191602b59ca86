import os
import itertools, subprocess, sys
shapes = {"m16n16k16":(16,16,16), "m32n8k16":(32,8,16), "m8n32k16":(8,32,16)}
LDM = 64
def ptx(shape, mat, layout, ctype):
    # number of regs
    if mat in "ab": nreg, rty, ety = 8, "b32", "f16"
    else:
        nreg, rty, ety = (4, "b32", "f16") if ctype=="f16" else (8, "f32", "f32")
    regs = ",".join(f"%r{i}" for i in range(nreg))
    decl = f".reg .{rty} %r<{nreg}>;"
    ldop = f"wmma.load.{mat}.sync.aligned.{layout}.{shape}.global.{ety}"
    stores = "\n".join(f"  st.global.{rty} [%rd4+{4*i}], %r{i};" for i in range(nreg))
    return f""".version 6.4
.target sm_70
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout){{
  .reg .u64 %rd<6>; .reg .u32 %l<3>;
  {decl}
  ld.param.u64 %rd1, [pin];
  ld.param.u64 %rd2, [pout];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  {ldop} {{{regs}}}, [%rd1], {LDM};
  mov.u32 %l0, %laneid;
  mul.wide.u32 %rd3, %l0, {4*nreg};
  add.u64 %rd4, %rd2, %rd3;
{stores}
  ret;
}}
"""
jobs=[]
for shape in shapes:
    for mat in "abc":
        for layout in ("row","col"):
            for ctype in (("f16","f32") if mat=="c" else ("f16",)):
                name=f"{shape}_{mat}_{layout}_{ctype}"
                open(name+".ptx","w").write(ptx(shape,mat,layout,ctype))
                r=subprocess.run([os.environ.get("PTXAS","/tmp/tools/ptxas"),"-arch=sm_70","-O3",name+".ptx","-o",name+".cubin"],capture_output=True,text=True)
                if r.returncode: print(name, r.stderr[:300]); continue
                d=subprocess.run([os.environ.get("NVDISASM","/tmp/tools/nvdisasm"),"-c","-hex" if False else "-c",name+".cubin"],capture_output=True,text=True)
                open(name+".sass","w").write(d.stdout)
                print(name,"ok")
