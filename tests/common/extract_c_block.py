#!/usr/bin/env python3
"""Write the first ```c block of a Markdown file to a C file, so documented examples compile."""
import sys

src, dst = sys.argv[1], sys.argv[2]
lines, inside = [], False
for line in open(src, encoding="utf-8"):
    if not inside and line.strip() == "```c":
        inside = True
    elif inside and line.strip() == "```":
        break
    elif inside:
        lines.append(line)
if not lines:
    sys.exit(f"{src}: no ```c block")
with open(dst, "w", encoding="utf-8") as f:
    f.write("".join(lines))
