"""The README's and docs/'s relative links resolve (scripts/check_links.py), and the checker finds
a broken file link and a broken anchor."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_links", ROOT / "scripts" / "check_links.py")
check_links = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_links)


def test_every_relative_link_of_the_readme_and_docs_resolves(capsys):
  assert check_links.main([]) == 0, capsys.readouterr().out
  assert capsys.readouterr().out.startswith("ok: ")


def test_broken_links_and_anchors_are_found_and_code_is_not_a_link(tmp_path):
  (tmp_path / "b.md").write_text("# Other page\n")
  page = tmp_path / "a.md"
  page.write_text("# A title\n[1](b.md) [2](b.md#other-page) [3](#a-title) [4](gone.md)\n"
                  "[5](b.md#nope) [6](#nope) `[7](gone.md)` [8](https://example.com/x)\n"
                  "```\n[9](gone.md)\n```\n")
  bad = check_links.check(page)
  assert [line.split(": ", 1)[1] for line in bad] == [
      "gone.md: no such file", "b.md#nope: no heading #nope in " + str(tmp_path / "b.md"),
      "#nope: no heading #nope in " + str(page)]
