import json
T={k:{tuple(map(int,kk.split(','))):tuple(v) for kk,v in t.items()} for k,t in json.load(open('tables.json')).items()}
def origin(shape,o):
    return {'m16n16k16':(8*(o&1),8*(o>>1)),'m32n8k16':(8*o,0),'m8n32k16':(0,8*o)}[shape]
def f(shape,mat,layout,ct,l,x):
    t,o,hi=l&3,(l>>2)&3,(l>>4)&1
    R0,C0=origin(shape,o)
    if mat=='a':
        m,k=((t+4*hi, x) if layout=='row' else ((x&3)+4*hi, t+(x&12)))
        return (R0+m,k)
    if mat=='b':
        k,n=((x, t+4*hi) if layout=='col' else (t+(x&12), (x&3)+4*hi))
        return (k,C0+n)
    if ct=='f16': return (R0+t+4*hi, C0+x)
    return (R0+(t&1)+(x&2)+4*hi, C0+(t&2)+(x&1)+(x&4))
tot=0
for name,t in T.items():
    shape,mat,layout,ct=name.split('_')
    bad=sum(1 for (l,x),v in t.items() if f(shape,mat,layout,ct,l,x)!=v)
    tot+=bad; print(f"{name:22s} mismatches={bad}")
print("TOTAL mismatches", tot)
