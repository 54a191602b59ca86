import json,sys
T={k:{tuple(map(int,kk.split(','))):tuple(v) for kk,v in t.items()} for k,t in json.load(open('tables.json')).items()}
for n in sys.argv[1:]:
    t=T[n]; nx=max(x for _,x in t)+1
    print(n)
    for l in range(32):
        print(f" l{l:2d}: "+" ".join(f"{t[(l,x)][0]:2d},{t[(l,x)][1]:<2d}" for x in range(nx)))
