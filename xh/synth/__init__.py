"""A generated mini-Wikipedia: people, cities, organisations, films and bands, with questions.

The world is a pure function of `WorldSpec(num_docs, seed)`. Page `i` is computed from
`(seed, i)` alone (its names, facts and the indices of the pages it links to), so any slice
of the world can be generated on its own and a large world is written as a stream of shards.

Write one with `xh synth --set synth.num_docs=2000` (shards in parallel on Ray, see
`workflows/synth.py`), or from Python:

    from xh.synth import WorldSpec, page, make_questions, write_world, output_under
    spec = WorldSpec(num_docs=2000, seed=13)
    print(page(spec, 0).sentences)        # one page, without generating the others
    questions = make_questions(spec, n=50, seed=0)
    summary = write_world(spec, output_under("/tmp/synth-world"))

What is written (relative to the root the `open_output` callback writes under):

    wiki/AA/wiki_00.bz2 ...      pages in the HotpotQA processed-Wikipedia format (bz2 JSON lines)
    hotpot/questions.json        HotpotQA questions (official distractor format, a JSON array)
    fever/claims.jsonl           FEVER claims (SUPPORTS / REFUTES / NOT ENOUGH INFO)
    fever/wiki-pages/wiki-000.jsonl ...  the same pages in the FEVER wiki-pages format
    truth/links/links-00000.jsonl.bz2 ...  every hyperlink: source, target, anchor, sentence index
    truth/summary.json           counts and paths (`WorldSummary`)

Why it is not too easy: names are built from shared word lists (many "Port ..." cities, many
people called Orla or Quinn), films and bands reuse city names ("Port Arden (film)"), anchors
are sometimes only a surname or a name without its disambiguator, and many people share a
birthplace, a nationality or a birth year. Questions draw their distractor paragraphs from
look-alike pages.

The modules, each importing only those above it:

- `xh.synth.words`: the word lists and year ranges every name and fact is drawn from.
- `xh.synth.layout`: `WorldSpec`, the kind of each page index, the seeded hashes, the name pools.
- `xh.synth.names`: a page's title and other names, computed without building the page.
- `xh.synth.pages`: `page(spec, i)`, one article with its links (`PageLink`) and facts.
- `xh.synth.formats`: a page as a HotpotQA dump record, a FEVER wiki-pages record, link rows.
- `xh.synth.questions`: HotpotQA bridge and comparison questions (`make_questions`).
- `xh.synth.claims`: FEVER claims (`make_claims`).
- `xh.synth.evidence`: the controlled worlds of the science checks: FEVER claims whose verdict needs two
  linked pages (`make_evidence_claims`), and both worlds as graph rows without anchors
  (`evidence_graph_rows`, `question_graph_rows`; these import the graph builders).
- `xh.synth.writing`: the files above, shard by shard (`write_shard`, `write_world`).

Generation needs only the standard library; FEVER's page-id spelling is the one of
`xh.wiki.titles` (importing `xh.wiki` also loads pyarrow, for its readers). Nothing happens at import.
"""

from xh.synth.claims import NOT_ENOUGH_INFO, REFUTES, SUPPORTS, make_claims
from xh.synth.evidence import (
    drop_anchors,
    evidence_graph_rows,
    make_evidence_claims,
    question_graph_rows,
)
from xh.synth.formats import fever_page_record, hotpot_record, iter_link_rows, link_rows, strip_links
from xh.synth.layout import (
    BAND,
    CITY,
    FILM,
    KINDS,
    MAX_DOCS,
    MIN_DOCS,
    ORGANISATION,
    PERSON,
    WorldSpec,
    kind_counts,
    kind_of,
)
from xh.synth.names import Name, name_of, title
from xh.synth.pages import Page, PageLink, iter_pages, page, quote_title
from xh.synth.questions import make_questions
from xh.synth.writing import (
    CLAIMS_PATH,
    QUESTIONS_PATH,
    SUMMARY_PATH,
    OpenOutput,
    ShardSummary,
    WorldSummary,
    fever_pages_path,
    links_shard_path,
    num_shards,
    output_under,
    wiki_shard_path,
    write_shard,
    write_tasks_and_summary,
    write_world,
)

# The one FEVER spelling of a page id (the claims' evidence and fever/wiki-pages use it),
# re-exported for callers that check the FEVER files against page titles.
from xh.wiki.titles import fever_page_id

__all__ = [
    "BAND",
    "CITY",
    "CLAIMS_PATH",
    "FILM",
    "KINDS",
    "MAX_DOCS",
    "MIN_DOCS",
    "NOT_ENOUGH_INFO",
    "ORGANISATION",
    "PERSON",
    "QUESTIONS_PATH",
    "REFUTES",
    "SUMMARY_PATH",
    "SUPPORTS",
    "Name",
    "OpenOutput",
    "Page",
    "PageLink",
    "ShardSummary",
    "WorldSpec",
    "WorldSummary",
    "drop_anchors",
    "evidence_graph_rows",
    "fever_page_id",
    "fever_page_record",
    "fever_pages_path",
    "hotpot_record",
    "iter_link_rows",
    "iter_pages",
    "kind_counts",
    "kind_of",
    "link_rows",
    "links_shard_path",
    "make_claims",
    "make_evidence_claims",
    "make_questions",
    "name_of",
    "num_shards",
    "output_under",
    "page",
    "question_graph_rows",
    "quote_title",
    "strip_links",
    "title",
    "wiki_shard_path",
    "write_shard",
    "write_tasks_and_summary",
    "write_world",
]
