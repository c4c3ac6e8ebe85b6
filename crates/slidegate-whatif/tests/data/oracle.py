# Independent oracle for the what-if fixture: each rule's admissions worked
# out from the definitions (exact log over (t-W, t], fixed windows aligned
# to Unix time, the conservative ring: buckets floor(t/b), b = ceil(W/(n-1)),
# the current bucket and the n-1 before it counted whole).
import re, datetime
from collections import defaultdict
NS=10**9
lines=open("access.log").read().splitlines()
ev=[]
for l in lines:
    m=re.match(r'(\S+) - - \[([^\]]+)\] "GET (\S+) ',l)
    ip,stamp,target=m.groups()
    t=int(datetime.datetime.strptime(stamp,"%d/%b/%Y:%H:%M:%S %z").timestamp())*NS
    ev.append((t,ip,target.split('?')[0]))
def log_algo(W,L):
    adm=defaultdict(list)
    def d(key,t):
        c=sum(1 for x in adm[key] if t-W < x <= t)
        if c+1<=L: adm[key].append(t); return True
        return False
    return d
def fixed(W,L):
    cnt=defaultdict(int)
    def d(key,t):
        k=(key,t//W)
        if cnt[k]+1<=L: cnt[k]+=1; return True
        return False
    return d
def ring(W,L,n):
    b=-(-W//(n-1)); adm=defaultdict(lambda: defaultdict(int))
    def d(key,t):
        i=t//b
        c=sum(v for j,v in adm[key].items() if i-(n-1)<=j<=i)
        if c+1<=L: adm[key][i]+=1; return True
        return False
    return d
def fmt(t): return datetime.datetime.fromtimestamp(t/NS,datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
rules={
 "remote_address": dict(W=60*NS,L=3,n=8, sel=lambda ip,p:("remote_address="+ip)),
 "path_/login": dict(W=10*NS,L=2,n=2, sel=lambda ip,p:("path=/login" if p=="/login" else None)),
}
for name,r in rules.items():
    for view,algo in [("as configured",ring(r["W"],r["L"],r["n"])),("sliding_log",log_algo(r["W"],r["L"])),("fixed_window",fixed(r["W"],r["L"]))]:
        matched=refused=0; first=None; top=defaultdict(int)
        for t,ip,p in ev:
            k=r["sel"](ip,p)
            if k is None: continue
            matched+=1
            if not algo(k,t):
                refused+=1; top[k]+=1
                if first is None: first=t
        print(name,view,matched,refused,fmt(first) if first else None,sorted(top.items(),key=lambda x:(-x[1],x[0])))
print()
for name,r in rules.items():
    algos=[ring(r["W"],r["L"],r["n"]),log_algo(r["W"],r["L"]),fixed(r["W"],r["L"])]
    for t,ip,p in ev:
        k=r["sel"](ip,p)
        if k is None: continue
        print(name, (t-ev[0][0])/NS, k, ["Y" if a(k,t) else "n" for a in algos], "bucket", t//(-(-r["W"]//(r["n"]-1))))
