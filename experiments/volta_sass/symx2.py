"""Tiny concrete interpreter for the straight-line Volta SASS that ptxas emits for
a single wmma.load + per-lane stores.  Tracks where every 16/32-bit value stored to
`out` came from in `in` (byte address).  Base of `in` = 0, base of `out` = OUT."""
import re, sys, json
M32 = 0xffffffff
OUT = 0x100000
CONST = {0x160: 0, 0x164: 0, 0x168: OUT, 0x16c: 0, 0x28: 0}

class Sym:  # provenance of a 16-bit or 32-bit loaded datum
    def __init__(s, addr, size): s.addr, s.size = addr, size
    def __repr__(s): return f"m{s.size}@{s.addr}"

def parse_ops(s):
    out=[]; depth=0; cur=''
    for ch in s:
        if ch=='[': depth+=1
        if ch==']': depth-=1
        if ch==',' and depth==0: out.append(cur.strip()); cur=''
        else: cur+=ch
    if cur.strip(): out.append(cur.strip())
    return out

def run(sass_text, lane):
    R = {}; P = {}
    def rd(op):
        op = op.replace('.reuse','')
        neg = op.startswith('-')
        if op == 'RZ': return 0
        if op == 'PT': return 1
        m = re.fullmatch(r'R(\d+)', op)
        if m: return R.get(int(m.group(1)), 0)
        m = re.fullmatch(r'c\[0x0\]\[(0x[0-9a-f]+)\]', op)
        if m: return CONST[int(m.group(1),16)]
        if op.startswith('0x') or op.isdigit(): return int(op,0)
        if op == 'SR_LANEID': return lane
        raise ValueError(op)
    def rnum(op): return int(op.replace('.reuse','')[1:])
    def pair(op):  # 64-bit value from register pair or constant pair
        op=op.replace('.reuse','')
        m = re.fullmatch(r'c\[0x0\]\[(0x[0-9a-f]+)\]', op)
        if m:
            a=int(m.group(1),16); return CONST[a] | (CONST[a+4]<<32)
        if op=='RZ': return 0
        n=rnum(op); lo=R.get(n,0); hi=R.get(n+1,0)
        return lo | (hi<<32)
    def addr(op):
        m = re.fullmatch(r'\[R(\d+)(?:\+(0x[0-9a-f]+))?\]', op)
        n=int(m.group(1)); off=int(m.group(2),16) if m.group(2) else 0
        return (R.get(n,0) | (R.get(n+1,0)<<32)) + off
    stores = []
    for line in sass_text.splitlines():
        m = re.match(r'\s*/\*[0-9a-f]{4}\*/\s+(@!?P\w+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;', line)
        if not m: continue
        pred, opc, rest = m.groups()
        if pred and pred.strip()=='@!PT': continue
        assert not pred, line
        ops = parse_ops(rest)
        base = opc.split('.')[0]
        if opc in ('NOP','EXIT','BRA'): 
            if opc=='EXIT': break
            continue
        if opc == 'S2R': R[rnum(ops[0])] = lane; continue
        if opc in ('MOV','IMAD.MOV.U32'):
            R[rnum(ops[0])] = rd(ops[-1]) & M32; continue
        if opc == 'IMAD.SHL.U32' or opc=='IMAD' or opc=='IMAD.IADD':
            R[rnum(ops[0])] = (rd(ops[1])*rd(ops[2]) + rd(ops[3])) & M32; continue
        if opc == 'IMAD.X':
            R[rnum(ops[0])] = (rd(ops[1])*rd(ops[2]) + rd(ops[3]) + P[ops[4]]) & M32; continue
        if opc == 'IMAD.WIDE.U32':
            v = rd(ops[1])*rd(ops[2]) + pair(ops[3]); d=rnum(ops[0])
            R[d] = v & M32; R[d+1] = (v>>32)&M32; continue
        if opc == 'SHF.R.U32.HI':
            R[rnum(ops[0])] = (rd(ops[3]) >> rd(ops[2])) & M32; continue
        if opc == 'SHF.L.U32':
            R[rnum(ops[0])] = (rd(ops[1]) << rd(ops[2])) & M32; continue
        if opc == 'LOP3.LUT':
            a,b,c,lut = rd(ops[1]),rd(ops[2]),rd(ops[3]),rd(ops[4]); v=0
            for bit in range(32):
                idx = (((a>>bit)&1)<<2)|(((b>>bit)&1)<<1)|((c>>bit)&1)
                v |= ((lut>>idx)&1)<<bit
            R[rnum(ops[0])] = v; continue
        if opc == 'LEA':
            if len(ops)==5:  # LEA Rd, P, a, c, s
                s=rd(ops[4]); v=((rd(ops[2])<<s)&M32) + rd(ops[3])
                R[rnum(ops[0])]=v&M32; P[ops[1]]=v>>32; continue
            s=rd(ops[3]); R[rnum(ops[0])]=(((rd(ops[1])<<s)&M32)+rd(ops[2]))&M32; continue
        if opc == 'LEA.HI.X':  # LEA.HI.X Rd, a, c, b, s, P : hi of (b:a)<<s plus c plus carry
            a,c,b,s = rd(ops[1]),rd(ops[2]),rd(ops[3]),rd(ops[4])
            v = ((((b<<32)|a) << s) >> 32) + c + P[ops[5]]
            R[rnum(ops[0])] = v & M32; continue
        if base == 'LDG':
            ad = addr(ops[1]); d=rnum(ops[0])
            if '.128' in opc or '.64' in opc:
                n = 4 if '.128' in opc else 2
                for i in range(n): R[d+i] = (Sym(ad+4*i,16), Sym(ad+4*i+2,16), Sym(ad+4*i,32))
            elif '.U16' in opc: R[d] = (Sym(ad,16), None, None)
            else: R[d] = (Sym(ad,16), Sym(ad+2,16), Sym(ad,32))
            continue
        if opc == 'PRMT':
            a=R[rnum(ops[1])]; sel=rd(ops[2]); b=R.get(rnum(ops[3]),(None,None,None))
            if not isinstance(b,tuple): b=(None,None,None)
            if sel==0x5410: R[rnum(ops[0])] = (a[0], b[0], None)
            elif sel==0x7632: R[rnum(ops[0])] = (a[1], b[1], None)
            else: raise NotImplementedError(line)
            continue
        if opc == 'IADD3':
            R[rnum(ops[0])] = (rd(ops[1])+rd(ops[2])+rd(ops[3])) & M32; continue
        if base == 'STG':
            ad=addr(ops[0]); d=rnum(ops[1])
            n = 4 if '.128' in opc else 2 if '.64' in opc else 1
            for i in range(n):
                v=R[d+i]
                if '.U16' in opc: stores.append((ad, ('h', v[0])))
                else: stores.append((ad+4*i, ('w', v)))
            continue
        raise NotImplementedError(line)
    return stores
