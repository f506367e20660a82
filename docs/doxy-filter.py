#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Doxygen INPUT_FILTER: read the public headers' plain comments as they are.

The headers stay the single source and keep their house style (a plain
/* comment above each declaration, "tw_name: what it does ..."). This
filter hands doxygen the same text, line for line, with:
- the file's first comment marked as the file's documentation (@file);
- a comment directly above a declaration or #define made a doc comment,
  its leading "tw_name:" (or "tw_a / tw_b:") dropped, as the page names it;
- declarations that share one comment (no blank line between them) put in
  one member group, so each gets the comment (DISTRIBUTE_GROUP_DOC);
- a comment after a struct member on its line made a member comment;
- an error list ("Returns 0, or:", then " *   TW_EXXX  cause" lines, as
  tests/check_docs.sh wants them) made @retval entries, and the line after
  the list starts a new paragraph (@details), so the man page shows one
  code a line under "Return values".
Comments followed by a blank line or by #pragma/#include/#if... stay plain.
"""
import re
import sys

RETVAL = re.compile(r"^(\s*\*)   (TW_E[A-Z]+|\(any code\))  +(\S.*)$")
CONTINUED = re.compile(r"^\s*\*      +\S")


def retvals(out, start, end):
    """Error lists of the doc comment out[start..end] as @retval lines."""
    inlist = False
    for k in range(start, end + 1):
        m = RETVAL.match(out[k])
        if m:
            code = "other" if m.group(2) == "(any code)" else m.group(2)
            out[k] = "%s @retval %s %s" % (m.group(1), code, m.group(3))
            inlist = True
        elif inlist and CONTINUED.match(out[k]):
            pass
        elif inlist:
            inlist = False
            body = out[k].split("*", 1)
            if body[1].strip() not in ("", "/"):
                out[k] = body[0] + "* @details" + body[1]


NAME_PREFIX = re.compile(r"^(\s*/\*\*)\s*(?:\(?tw_\w+\)?(?:\(\))?(?:\s*(?:/|,|and)\s*tw_\w+(?:\(\))?)*):\s*")
PLAIN_AFTER = ("#pragma", "#include", "#if", "#endif", "#else", "#elif", "#ifdef", "#ifndef",
               "extern", "}")


def is_decl_start(line):
    s = line.strip()
    return bool(s) and not s.startswith("/*") and not s.startswith("*") and \
        not s.startswith(PLAIN_AFTER) and not s.startswith("//")


def decl_end(lines, i):
    """Index of the line that ends the declaration starting at i: a
    #define's last line, or the line whose ';' closes it outside braces."""
    if lines[i].lstrip().startswith("#define"):
        while lines[i].rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
        return i
    depth = 0
    for j in range(i, len(lines)):
        code = re.sub(r"/\*.*?\*/", "", lines[j]).split("/*")[0]
        depth += code.count("{") - code.count("}")
        if depth == 0 and code.rstrip().endswith((";", "}")):
            return j
    return len(lines) - 1


def main():
    lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
    out = list(lines)
    pre = [""] * len(lines)  # group markers put before a line
    seen_file_comment = False
    depth = 0  # braces open before this line (struct and enum bodies)
    in_cpp = False
    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.lstrip()
        code = re.sub(r"/\*.*?\*/", "", line).split("/*")[0]
        # extern "C" { ... } (inside #ifdef __cplusplus) is no body.
        if s.startswith("#ifdef __cplusplus"):
            in_cpp = True
        elif s.startswith("#endif"):
            in_cpp = False
        if in_cpp:
            code = ""
        if s.startswith("/*") and not s.startswith("/**") and "SPDX-License-Identifier" not in s:
            start = i
            while "*/" not in lines[i]:
                i += 1
            end = i
            if not seen_file_comment and start < 5:
                seen_file_comment = True
                # @file goes at the comment's end: the line count stays.
                out[start] = line.replace("/*", "/**", 1)
                out[end] = out[end].replace("*/", "@file */", 1)
                i += 1
                continue
            nxt = end + 1
            if nxt < len(lines) and is_decl_start(lines[nxt]):
                out[start] = NAME_PREFIX.sub(r"\1 ", line.replace("/*", "/**", 1), count=1)
                retvals(out, start, end)
                # Declarations right below that share the comment.
                j = nxt
                last = decl_end(lines, j)
                count = 1
                while depth == 0 and last + 1 < len(lines) and is_decl_start(lines[last + 1]):
                    last = decl_end(lines, last + 1)
                    count += 1
                if count > 1 and last + 1 < len(lines):
                    # The group ends at the start of the next line: at the
                    # end of a #define line it would join the macro.
                    pre[start] += "/**@{*/ "
                    pre[last + 1] += "/**@}*/ "
            i += 1
            continue
        # A comment after a struct member or enum value documents it.
        m = re.match(r"^(\s*\S.*?[;,]\s*)/\*(?!\*)(.*)$", line)
        if m and depth > 0 and not s.startswith(("/*", "*", "#")):
            out[i] = m.group(1) + "/**<" + m.group(2)
        depth += code.count("{") - code.count("}")
        i += 1
    sys.stdout.write("\n".join(p + o for p, o in zip(pre, out)))


main()
