#!/usr/bin/env python3
"""Writes shop.log.gz: two hours of a shop's combined access log where the
algorithms disagree, deterministically (fixed seed, gzip without a time).

Against 20 requests a minute per client (`--limit 20 --window 1m`):
- 203.0.113.9 scrapes a page every 2 s for two hours: far over the limit,
  and every algorithm lets about 20 a minute through;
- 198.51.100.23 logs in 20 times in the last 2 s of a minute and 20 times
  in the first 2 s of the next, every 10 minutes: a fixed window admits all
  40, the sliding counts about half;
- 192.0.2.44 browses at about 19 a minute, in bursts: near the limit,
  where the estimates differ from the exact count;
- 198.51.100.77 sends 35 requests in 11 s once, across a minute's end;
- 192.0.2.200, a health check, asks every 4 s: busy, and under the limit
  for every algorithm;
- 10 other clients browse at 2 a minute.

    python3 shop_log.py   # in this folder
"""
import gzip
import time
import random

START = 1699948800  # 2023-11-14T08:00:00Z
SPAN = 2 * 3600
rng = random.Random(40)
lines = []


def add(t, client, method, path, ua):
    lines.append((t, client, method, path, ua))


for s in range(0, SPAN, 2):
    add(START + s, "203.0.113.9", "GET", f"/products?page={s // 2 % 400 + 1}", "scrapy/2.11")
for episode in range(SPAN // 600):
    edge = START + 600 * episode + 540 + 60  # a minute's end, 9m into each 10m
    for i in range(20):
        add(edge - 2 + i // 10, "198.51.100.23", "POST", "/login", "python-requests/2.31.0")
        add(edge + i // 10, "198.51.100.23", "POST", "/login", "python-requests/2.31.0")
for minute in range(SPAN // 60):
    n = rng.choice([14, 17, 19, 19, 21, 24])
    base = START + 60 * minute
    for _ in range(n):
        add(base + rng.randrange(60), "192.0.2.44", "GET", f"/item/{rng.randrange(1, 900)}", "Mozilla/5.0 (X11; Linux x86_64)")
for s in range(0, SPAN, 4):
    add(START + s + 1, "192.0.2.200", "GET", "/health", "kube-probe/1.29")
burst = START + 72 * 60 + 55  # 09:12:55
for i in range(35):
    add(burst + i * 11 // 35, "198.51.100.77", "GET", "/search?q=deal", "Mozilla/5.0 (Macintosh)")
for c in range(10):
    client = f"10.1.{c}.{10 + c}"
    for minute in range(SPAN // 60):
        for _ in range(2):
            add(START + 60 * minute + rng.randrange(60), client, "GET", f"/item/{rng.randrange(1, 900)}", "Mozilla/5.0 (Windows NT 10.0)")

lines.sort(key=lambda l: l[0])
months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
out = []
for t, client, method, path, ua in lines:
    g = time.gmtime(t)
    stamp = f"{g.tm_mday:02}/{months[g.tm_mon - 1]}/{g.tm_year}:{g.tm_hour:02}:{g.tm_min:02}:{g.tm_sec:02} +0000"
    out.append(f'{client} - - [{stamp}] "{method} {path} HTTP/1.1" 200 {rng.randrange(200, 9000)} "-" "{ua}"\n')
with open("shop.log.gz", "wb") as f:
    with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write("".join(out).encode())
print(f"{len(out)} lines")
