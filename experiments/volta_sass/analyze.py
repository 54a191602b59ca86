import symx, json, glob, os
LDM=64
res={}
for f in sorted(glob.glob('*.sass')):
    name=f[:-5]; shape,mat,layout,ct=name.split('_')
    t=open(f).read()
    table={}
    for lane in range(32):
        for (oaddr,val) in symx.run(t,lane):
            slot=(oaddr-symx.OUT)-lane*(32 if (mat in 'ab' or ct=='f32') else 16)
            r=slot//4
            if mat=='c' and ct=='f32':
                s=val[2]; assert s is not None; off=s.addr//4
                elems=[(r,off)]
            else:
                elems=[(2*r+h, val[h].addr//2) for h in (0,1)]
            for x,off in elems:
                if layout=='row': rc=(off//LDM, off%LDM)
                else: rc=(off%LDM, off//LDM)
                table[(lane,x)]=rc
    res[name]=table
json.dump({k:{f"{l},{x}":v for (l,x),v in t.items()} for k,t in res.items()}, open('tables.json','w'))
for k,t in res.items():
    nx=max(x for _,x in t)+1
    cells=set(t.values())
    print(f"{k:22s} elems/lane={nx:2d} distinct cells={len(cells):3d} rows={1+max(r for r,_ in cells)} cols={1+max(c for _,c in cells)}")
