import json
T={k:{tuple(map(int,kk.split(','))):tuple(v) for kk,v in t.items()} for k,t in json.load(open('tables.json')).items()}
b=lambda l,i:(l>>i)&1
F={
 'm16n16k16_a_row_f16': lambda l,x:((l&3)+8*b(l,2)+4*b(l,4), x),
 'm16n16k16_a_col_f16': lambda l,x:(8*b(l,2)+4*b(l,4)+(x&3), (l&3)+(x&12)),
 'm16n16k16_b_col_f16': lambda l,x:(x, (l&3)+8*b(l,3)+4*b(l,4)),
 'm16n16k16_b_row_f16': lambda l,x:((l&3)+(x&12), 8*b(l,3)+4*b(l,4)+(x&3)),
 'm16n16k16_c_row_f16': lambda l,x:((l&3)+8*b(l,2)+4*b(l,4), x+8*b(l,3)),
 'm16n16k16_c_col_f16': lambda l,x:((l&3)+8*b(l,2)+4*b(l,4), x+8*b(l,3)),
 'm16n16k16_c_row_f32': lambda l,x:((l&1)+8*b(l,2)+4*b(l,4)+(x&2), (l&2)+8*b(l,3)+(x&1)+(x&4)),
 'm16n16k16_c_col_f32': lambda l,x:((l&1)+8*b(l,2)+4*b(l,4)+(x&2), (l&2)+8*b(l,3)+(x&1)+(x&4)),
}
G={ # GPGPU-Sim variant for B
 'm16n16k16_b_col_f16': lambda l,x:(x, (l&3)+8*b(l,2)+4*b(l,4)),
 'm16n16k16_b_row_f16': lambda l,x:((l&3)+(x&12), 8*b(l,2)+4*b(l,4)+(x&3)),
}
def chk(name,f):
    t=T[name]; bad=[(k,t[k],f(*k)) for k in t if tuple(f(*k))!=t[k]]
    return len(bad), bad[:3]
for n,f in F.items(): print('wmmae/derived', n, chk(n,f))
for n,f in G.items(): print('gpgpu-sim    ', n, chk(n,f))
