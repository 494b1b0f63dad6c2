"""README.md and docs/ against the repository: docs/layout.md names every module and top-level folder, and
nothing that is not there; every relative link (and its #anchor) leads somewhere; README stays a guide."""
import re

from tests.support import REPO

LAYOUT = REPO / "docs" / "layout.md"
MODULE_FOLDERS = ("rules", "kernels")   # recursively: rules/runtime/ and kernels/ep/ are in them
README_MAX_LINES = 300
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$", re.M)


def named(text: str) -> set[str]:
    """Paths a page names in backticks: `rules/declare/spec.py`, `kernels/ep/`, `.ci/`."""
    return set(re.findall(r"`([\w.-]+(?:/[\w.-]+)*/?)`", text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """The text less its code (fenced blocks, `spans`): `kernel[grid](...)` is a call, not a link."""
    return re.sub(r"``.*?``|`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


def pages():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def project_folders() -> list[str]:
    """The checkout's top-level folders, less hidden ones and what .gitignore names (no git needed: an unpacked
    sdist or a restored CI cache has no .git)."""
    import fnmatch
    ignored = [line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    return sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored))


def test_the_layout_page_names_every_module_and_top_level_folder():
    names = named(LAYOUT.read_text())
    modules = sorted(str(p.relative_to(REPO)) for folder in MODULE_FOLDERS for p in (REPO / folder).rglob("*.py"))
    folders = project_folders()
    missing = [m for m in modules if m not in names] + [f"{f}/" for f in folders if f not in names and f"{f}/" not in names]
    assert not missing, f"docs/layout.md: not named there (add a line each): {', '.join(missing)}"


def test_every_module_the_layout_page_names_exists():
    gone = sorted(n for n in named(LAYOUT.read_text()) if n.endswith(".py") and not (REPO / n).is_file())
    assert not gone, f"docs/layout.md names modules that do not exist (remove or rename them): {', '.join(gone)}"


def test_every_relative_link_leads_to_a_file_and_its_anchor():
    anchors = {page.resolve(): {slug(h) for h in HEADING.findall(page.read_text())} for page in pages()}
    broken = []
    for page in pages():
        for link in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):   # http:, https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page.resolve()
            if not target.exists() or (anchor and target in anchors and anchor not in anchors[target]):
                broken.append(f"{page.relative_to(REPO)}: ({link})")
    assert not broken, "links that lead nowhere: " + "; ".join(broken)


def test_readme_stays_a_guide():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (f"README.md: {lines} lines, at most {README_MAX_LINES}: move reference "
                                       f"material into docs/ and link it")
