# The Markdown table of bench/rls.sh and bench/peers.sh: given a file of
# rlsload's (bench/loadrun's) JSON lines, one row per system and case, the
# medians over the rounds. "vs floor" and "vs memory" are against the
# systems named floor and sluice-memory in the same rounds; each further
# system named on the command line adds two columns, the requests/s and the
# machine CPU per request against its own in each round (medians).
#
#   python3 bench/rlstable.py results.jsonl [system…]
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = {}
for r in rows:
    cases.setdefault((r["name"], r.get("domain", "bench"), r["callers"], r["keys"]), []).append(r)
def med(rs, field):
    return statistics.median(r.get(field, 0) for r in rs)
def vs(rs, base, field):
    return f'{statistics.median(r[field] / b[field] for r, b in zip(rs, base)):.2f}' if base else ""
bases = sys.argv[2:]
extra = "".join(f" vs {b} | machine CPU vs {b} |" for b in bases)
print("\n| system | domain | C | K | req/s | vs floor | vs memory | p50 µs | p99 µs | p99.9 µs | server CPU µs/req | CPU vs floor | Redis CPU µs/req | Redis reads/s | load generator CPU µs/req | machine CPU µs/req | machine busy |" + extra)
print("| --- " * (17 + 2 * len(bases)) + "|")
for (name, d, c, k), rs in cases.items():
    f = cases.get(("floor", d, c, k), [])
    rps, frps = med(rs, "rps"), med(f, "rps") if f else 0
    cpu, fcpu = med(rs, "server_cpu_us_per_request"), med(f, "server_cpu_us_per_request") if f else 0
    span = f' ({min(r["rps"] for r in rs):.0f}–{max(r["rps"] for r in rs):.0f})' if len(rs) > 1 else ""
    store = med(rs, "store_cpu_us_per_request")
    reads = f'{med(rs, "store_reads_per_s"):.0f}' if store else "–"
    mem = cases.get(("sluice-memory", d, c, k), [])
    vsmem = vs(rs, mem, "rps")
    more = "".join(f' {vs(rs, cases.get((b, d, c, k), []), "rps")} | {vs(rs, cases.get((b, d, c, k), []), "machine_cpu_us_per_request")} |' for b in bases)
    print(f'| {name} | {d} | {c} | {k} | {rps:.0f}{span} | {rps / frps if frps else 0:.2f} | {vsmem} | {med(rs, "p50_us"):.0f} | {med(rs, "p99_us"):.0f} | {med(rs, "p999_us"):.0f} | {cpu:.1f} | {cpu / fcpu if fcpu else 0:.2f} | {f"{store:.1f}" if store else "–"} | {reads} | {med(rs, "loadgen_cpu_us_per_request"):.1f} | {med(rs, "machine_cpu_us_per_request"):.1f} | {100 * med(rs, "machine_busy"):.0f} % |' + more)
