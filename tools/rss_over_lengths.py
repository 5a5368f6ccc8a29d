"""Resident memory of `veil demo` after each of twenty prompts of twenty lengths (1..20 words).

Usage: python3 tools/rss_over_lengths.py target/release/veil
Prints the process's VmRSS after the first and the last prompt and their ratio (issue 16's check:
the server's memory must not grow with the number of distinct prompt lengths).
"""
import subprocess, sys, re
binary = sys.argv[1]
words = "this film is a good honest and moving story about people who try hard to be kind even when life is bleak".split()
args = [" ".join(words[:n]) for n in range(1, 21)]
p = subprocess.Popen([binary, "demo", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
rss = []
for line in p.stdout:
    if line.startswith("online total"):
        with open(f"/proc/{p.pid}/status") as f:
            kb = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        rss.append(kb)
p.wait()
print("RSS KiB after prompt 1:", rss[0], " after prompt 20:", rss[-1], " ratio %.3f" % (rss[-1] / rss[0]), " max during:", max(rss))
print("all:", rss)
