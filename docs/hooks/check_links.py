"""Check the internal links of a built site: every ``href`` and ``src`` that points into the
site names a file that exists and, with a ``#fragment``, an element of that page with that id.

    python docs/hooks/check_links.py [SITE_DIR]      (default: site)

External links (``http:``, ``https:``, ``mailto:``, ...) are not followed. Prints one line per
broken link and exits with status 1 if there is any.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link")) or (name == "src" and tag == "img"):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def _target(site: Path, page: Path, path: str) -> Path:
    """The file a link's path names, from ``page`` (a directory means its index.html)."""
    base = site if path.startswith("/") else page.parent
    target = (base / unquote(path.lstrip("/"))).resolve()
    return target / "index.html" if target.is_dir() or path.endswith("/") else target


def broken_links(site: Path) -> list[str]:
    """``"page: link (why)"`` for each internal link of ``site`` that leads nowhere."""
    site = site.resolve()
    pages = {p.resolve(): _parse(p) for p in site.rglob("*.html")}
    problems = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("data:"):
                continue
            target = _target(site, path, parts.path) if parts.path else path
            where = f"{path.relative_to(site)}: {link}"
            if not target.is_file():
                problems.append(f"{where} (no file {target.relative_to(site.parent)})")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where} (no anchor #{parts.fragment})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    site = Path(args[0] if args else "site")
    if not (site / "index.html").is_file():
        print(f"error: {site} holds no built site (run mkdocs build first)", file=sys.stderr)
        return 2
    problems = broken_links(site)
    for line in problems:
        print(line)
    pages = sum(1 for _ in site.rglob("*.html"))
    print(f"{pages} pages checked, {len(problems)} broken internal links", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
