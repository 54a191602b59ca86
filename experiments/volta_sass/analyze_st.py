import symx2 as S, glob, json
LDM=64
from unified import f
res={}
for fn in sorted(glob.glob('st/*.sass')):
    name=fn[3:-5]; shape,_,layout,ct=name.split('_')
    t=open(fn).read(); nreg=4 if ct=='f16' else 8
    tab={}
    for lane in range(32):
        for (oa,(kind,v)) in S.run(t,lane):
            off_b=oa-S.OUT
            if ct=='f32':
                assert kind=='w'; s=v[2]; src=s.addr; l,r=divmod(src,4*nreg); assert l==lane; x=r//4
                eoff=off_b//4; items=[(x,eoff)]
            else:
                halves=[v] if kind=='h' else [v[0],v[1]]
                items=[]
                for j,hs in enumerate(halves):
                    l,r=divmod(hs.addr,4*nreg); assert l==lane, (l,lane)
                    x=r//2; items.append((x,off_b//2+j))
            for x,eoff in items:
                rc=(eoff//LDM,eoff%LDM) if layout=='row' else (eoff%LDM,eoff//LDM)
                assert (lane,x) not in tab; tab[(lane,x)]=rc
    bad=sum(1 for (l,x),rc in tab.items() if f(shape,'c',layout,ct,l,x)!=rc)
    print(f"store {name:20s} entries={len(tab)} mismatches_vs_load_formula={bad}")
