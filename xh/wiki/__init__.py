"""Wikipedia dump readers: HotpotQA's processed Wikipedia, MediaWiki XML and FEVER's wiki-pages.

    from xh.wiki import ReadCounts, normalize_title, read_records

    counts = ReadCounts()
    with open("enwiki-pages-articles1.xml.bz2", "rb") as stream:
        for record in read_records("mediawiki", stream, "enwiki-pages-articles1.xml.bz2", counts):
            ...  # record.kind is "doc", "redirect" or "quarantine"; record.row() is its table row
    assert counts.balanced

- `xh.wiki.titles`: `normalize_title`, the one spelling of a title that links, pages, redirects and
  evidence meet on; `fever_page_id`, its FEVER spelling.
- `xh.wiki.readers`: the readers, the records they yield (`Doc`, `Redirect`, `Quarantine`, `Link`)
  and `ReadCounts` (records read = docs + redirects + quarantined).
- `xh.wiki.mediawiki`: wikitext -> the lead paragraph's sentences and links (mwparserfromhell).
"""

from xh.wiki.readers import (
    FORMATS,
    Doc,
    Link,
    Quarantine,
    ReadCounts,
    Record,
    Redirect,
    read_fever,
    read_hotpot,
    read_mediawiki,
    read_records,
)
from xh.wiki.titles import fever_page_id, normalize_title

__all__ = [
    "FORMATS",
    "Doc",
    "Link",
    "Quarantine",
    "ReadCounts",
    "Record",
    "Redirect",
    "fever_page_id",
    "normalize_title",
    "read_fever",
    "read_hotpot",
    "read_mediawiki",
    "read_records",
]
