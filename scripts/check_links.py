"""Checks the relative links of README.md and docs/*.md: every target file exists, and every
#anchor names a heading of its target (GitHub's slugs). Run from anywhere:

  python3 scripts/check_links.py            # README.md and docs/*.md
  python3 scripts/check_links.py FILE.md    # other files

Prints one line per broken link and exits 1 if there is one. Links in code blocks and code spans
are not links; http(s) and mailto links are not checked.
"""

import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text):
  """The text without fenced code blocks and code spans (same line count)."""
  out, fenced = [], False
  for line in text.split("\n"):
    if line.lstrip().startswith("```"):
      fenced = not fenced
      out.append("")
    else:
      out.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
  return out


def slugs(path):
  """GitHub's anchors for the headings of a markdown file."""
  seen, found = collections.Counter(), set()
  fenced = False
  for line in path.read_text().split("\n"):
    if line.lstrip().startswith("```"):
      fenced = not fenced
    if fenced or not re.match(r"#{1,6} ", line):
      continue
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
    slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
    seen[slug] += 1
  return found


def _shown(path):
  return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def check(path):
  bad = []
  for number, line in enumerate(prose(path.read_text()), 1):
    for target in LINK.findall(line):
      if re.match(r"[a-z]+:", target):
        continue
      file, _, anchor = target.partition("#")
      dest = (path.parent / file).resolve() if file else path
      where = f"{_shown(path)}:{number}: {target}"
      if not dest.exists():
        bad.append(f"{where}: no such file")
      elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
        bad.append(f"{where}: no heading #{anchor} in {_shown(dest)}")
  return bad


def main(argv):
  files = [pathlib.Path(a).resolve() for a in argv] or [ROOT / "README.md",
                                                        *sorted((ROOT / "docs").glob("*.md"))]
  bad, count = [], 0
  for f in files:
    count += sum(len(LINK.findall(line)) for line in prose(f.read_text()))
    bad += check(f)
  print("\n".join(bad) if bad else f"ok: {count} links in {len(files)} files")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
