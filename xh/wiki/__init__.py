"""Wikipedia dump readers: HotpotQA's processed Wikipedia, MediaWiki XML and FEVER's wiki-pages.

    from xh.wiki.readers import read_records
    from xh.wiki.records import ReadCounts

    counts = ReadCounts()
    with open("enwiki-pages-articles1.xml.bz2", "rb") as stream:
        for record in read_records("mediawiki", stream, "enwiki-pages-articles1.xml.bz2", counts):
            ...  # record.kind is "doc", "redirect" or "quarantine"; record.row() is its table row
    assert counts.balanced

The modules, in reading order (each imports only those listed before it):

- `xh.wiki.titles`: `normalize_title`, the one spelling of a title that links, pages, redirects and
  evidence meet on; `fever_page_id`, its FEVER spelling.
- `xh.wiki.records`: what the readers yield (`Doc`, `Redirect`, `Quarantine`, `Link`), the quarantine
  reasons and `ReadCounts` (records read = docs + redirects + quarantined).
- `xh.wiki.streams`: bytes in: bz2 detection and decompression, a truncated tail, lines, JSON lines.
- `xh.wiki.hotpot`, `xh.wiki.fever`: the two JSON-lines formats.
- `xh.wiki.wikitext`: wikitext -> the lead paragraph's sentences and links (mwparserfromhell).
- `xh.wiki.mediawiki`: the MediaWiki XML format (pages cut from the dump, each read with `wikitext`).
- `xh.wiki.readers`: `read_records(fmt, ...)`, one entry point for the three; what a record is.
- `xh.wiki.process`: the dump files -> the docs / links / redirects / anchors / quarantine tables.
"""
