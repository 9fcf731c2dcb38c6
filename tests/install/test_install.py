#!/usr/bin/env python3
"""The installed face of the library (issue #14), as a user meets it:

  1. `meson install --destdir` of the build into a temporary directory;
  2. every header of include/ is installed, and each installed header compiles on its own, as C
     and (where a C++ compiler is found) as C++;
  3. every function the installed headers declare carries SA_API, and the installed library
     exports each of them; it exports nothing else but the SA_INTERNAL_API functions of the
     source tree's internal headers (for the project's own tools), and no C++ symbol;
  4. a generated program checks that the ABI check (sa_abi_sizeof / sa_abi_offsetof) knows
     every field of every struct the installed headers define, at the installed headers'
     layout; it, tests/install/consumer.c and the docs/api.md example (api_example.c, extracted
     by tests/common/extract_c_block.py) compile against the installed headers alone, link
     against the installed library alone, and run.

usage: test_install.py MESON BUILD_DIR SOURCE_DIR SANITIZE CONSUMER_C API_EXAMPLE_C CC [ARGS...]
Exit 0 on success, 1 with a message on the first failure.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

meson, build, source, sanitize, consumer_c, example_c = sys.argv[1:7]
cc = sys.argv[7:]
san = [] if sanitize in ("", "none") else ["-fsanitize=" + sanitize]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        fail("%s\n(exit %d)\n%s" % (" ".join(cmd), r.returncode, r.stdout))
    return r.stdout


def find(root, name):
    hits = [os.path.join(d, name) for d, _, files in os.walk(root) if name in files]
    if len(hits) != 1:
        fail("expected one %s under %s, found %s" % (name, root, hits))
    return hits[0]


# A C function declaration at the top level of a header: `type name(` (what SA_API must mark).
DECL = re.compile(r"^(?:SA_API |SA_INTERNAL_API )?(?:const |unsigned |struct )*[A-Za-z_]\w*"
                  r"(?: \*+| |\*+ )\**([A-Za-z_]\w*)\(")


def declarations(path):
    """[(name, marker)] of the top-level function declarations of a header: marker 'SA_API',
    'SA_INTERNAL_API' or ''. Comments, struct bodies, inline functions and typedefs are
    skipped (a rough scanner for this project's header style)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"),
                  open(path, encoding="utf-8").read(), flags=re.S)
    out, depth, cont = [], 0, False
    for line in text.split("\n"):
        code = line.split("//")[0].rstrip()
        m = DECL.match(code)
        if depth == 0 and not cont and m and not code.startswith(("typedef", "static", "extern")):
            marker = code.split(" ")[0] if code.startswith(("SA_API ", "SA_INTERNAL_API ")) else ""
            out.append((m.group(1), marker))
            cont = not code.endswith(";")
        elif cont:
            cont = not code.endswith(";")
        s = code.strip()
        if not (s.startswith("#") or 'extern "C"' in s or (s == "}" and depth == 0)):
            depth += s.count("{") - s.count("}")
    return out


# abi_all.c, filled in with the structs of the installed headers.
ABI_ALL_C = r"""#include <stddef.h>
#include <stdio.h>
@INCLUDES@
static int bad;

static void ck(const char *type, const char *field, size_t got, size_t want)
{
    if (got != want) {
        fprintf(stderr, "%s %s: the library says %zu, the installed header %zu (common/sa_abi.c)\n",
                type, field ? field : "(sizeof)", got, want);
        bad = 1;
    }
}

int main(void)
{
@CHECKS@
    if (!bad)
        printf("abi: @SUMMARY@, all known to sa_abi_sizeof / sa_abi_offsetof\n");
    return bad;
}
"""


def structs(path):
    """{name: [fields]} of the structs a header defines with a body (`typedef struct NAME {`)."""
    text = re.sub(r"/\*.*?\*/", "", open(path, encoding="utf-8").read(), flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out = {}
    for m in re.finditer(r"(?:typedef\s+)?struct\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = re.sub(r"\[[^]]*\]", "", decl).strip()
            if not decl:
                continue
            fp = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
            if fp:
                fields.append(fp.group(1))
                continue
            first, *rest = decl.split(",")
            fields.append(re.findall(r"\w+", first)[-1])
            fields += [re.findall(r"\w+", r)[-1] for r in rest]
        out[m.group(1)] = fields
    return out


tmp = tempfile.mkdtemp(prefix="sa-install-")
try:
    # 1. Install.
    dest = os.path.join(tmp, "dest")
    run([meson, "install", "-C", build, "--no-rebuild", "--destdir", dest])
    lib = find(dest, "libsparseattn.so")
    inc = os.path.dirname(find(dest, "sparseattn.h"))
    libdir = os.path.dirname(lib)

    # 2. The installed headers: all of include/, each compiling alone.
    public = sorted(f for f in os.listdir(os.path.join(source, "include")) if f.endswith(".h"))
    installed = sorted(f for f in os.listdir(inc) if f.endswith(".h"))
    missing = sorted(set(public) - set(installed))
    if missing:
        fail("public headers not installed (add them to install_headers in meson.build): %s"
             % missing)
    cxx = next((c for c in [os.environ.get("CXX"), "c++", "g++", "clang++"]
                if c and shutil.which(c)), None)
    for h in installed:
        tu = os.path.join(tmp, "alone_" + h.replace(".", "_"))
        with open(tu + ".c", "w") as f:
            f.write("#include <%s>\nint sa_alone_%s;\n" % (h, h.replace(".", "_")))
        run(cc + ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-I", inc,
                  "-fsyntax-only", tu + ".c"])
        if cxx:
            shutil.copy(tu + ".c", tu + ".cc")
            run([cxx, "-std=c++11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-I", inc,
                 "-fsyntax-only", tu + ".cc"])
    print("%d public headers installed, each compiles alone as C%s: %s"
          % (len(installed), " and C++ (%s)" % cxx if cxx else " (no C++ compiler found)",
             " ".join(installed)))

    # 3. The exports: exactly SA_API and SA_INTERNAL_API.
    api = set()
    for h in installed:
        for name, marker in declarations(os.path.join(inc, h)):
            if marker != "SA_API":
                fail("%s declares %s without SA_API: the library would not export it"
                     % (h, name))
            api.add(name)
    internal = set()
    for d, dirs, files in os.walk(source):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "include"]
        for f in files:
            if f.endswith((".h", ".cuh")):
                internal |= {n for n, m in declarations(os.path.join(d, f))
                             if m == "SA_INTERNAL_API"}
    nm = shutil.which("nm")
    if nm:
        exported = set()
        for line in run([nm, "-D", "--defined-only", lib]).splitlines():
            parts = line.split()
            if len(parts) >= 3:
                exported.add(parts[2])
        unexported = sorted(api - exported)
        if unexported:
            fail("declared in the public headers but not exported: %s" % unexported)
        # A coverage build (-Db_coverage=true) links gcov's runtime, which exports its own
        # symbols: those are the toolchain's, not ours.
        stray = sorted(n for n in exported - api - internal
                       if not n.startswith("__gcov_") and n != "mangle_path")
        if stray:
            fail("exported but declared with neither SA_API nor SA_INTERNAL_API: %s" % stray)
        print("exports: %d (%d public, %d internal of %d SA_INTERNAL_API declarations)"
              % (len(exported), len(api), len(exported & internal), len(internal)))
    else:
        print("nm not found: export check skipped")

    # 4. Programs built against the installed face only, run against the installed library.
    # abi_all.c: the ABI check (sa_abi_sizeof / sa_abi_offsetof) knows every field of every
    # struct the installed headers define, with the layout the installed headers give it.
    known = {}
    for h in installed:
        known.update(structs(os.path.join(inc, h)))
    checks = []
    for name, fields in sorted(known.items()):
        checks.append('    ck("%s", NULL, sa_abi_sizeof("%s"), sizeof(%s));' % (name, name, name))
        checks += ['    ck("%s", "%s", sa_abi_offsetof("%s", "%s"), offsetof(%s, %s));'
                   % (name, f, name, f, name, f) for f in fields]
    abi_c = os.path.join(tmp, "abi_all.c")
    with open(abi_c, "w") as f:
        f.write(ABI_ALL_C.replace("@INCLUDES@", "".join("#include <%s>\n" % h for h in installed))
                .replace("@CHECKS@", "\n".join(checks))
                .replace("@SUMMARY@", "%d structs, %d fields"
                         % (len(known), len(checks) - len(known))))
    env = dict(os.environ, LD_LIBRARY_PATH=libdir)
    for src in [abi_c, consumer_c, example_c]:
        exe = os.path.join(tmp, os.path.basename(src)[:-2])
        run(cc + ["-std=c11", "-Wall", "-Wextra", "-Werror", "-I", inc, src, "-o", exe,
                  "-L", libdir, "-Wl,-rpath," + libdir, "-lsparseattn", "-lm"] + san)
        if shutil.which("ldd"):
            where = [l for l in run(["ldd", exe], env=env).splitlines() if "libsparseattn" in l]
            if not where or os.path.realpath(libdir) not in os.path.realpath(
                    where[0].split("=>")[-1].split("(")[0].strip()):
                fail("%s does not load the installed library: %s" % (exe, where))
        out = run([exe], env=env)
        print("%s: ran\n%s" % (os.path.basename(src), out.rstrip()))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
