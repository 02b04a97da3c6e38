"""Controlled FEVER claims where the verdict needs hop attention: evidence sentences chosen per claim.

    from xh.synth import WorldSpec, make_evidence_claims, evidence_graph_rows
    claims = make_evidence_claims(WorldSpec(num_docs=2000, seed=7), n=600, seed=0)
    rows = evidence_graph_rows(claims)                # `graphs` table rows, task "fever" (xh.graph.fever)
    typed = evidence_graph_rows(claims, "typed")      # the same nodes, edges typed for GESA

Three slices (`_slice`), each claim with its candidate sentences (`_candidates`, shuffled, `nodes` long):

- **multi**: "The founder of Arden Motors was born in Port Valham." Evidence is two sentences of two
  linked pages: page A's sentence that names B ("It was founded by Mina Kessler.") and B's sentence
  that states the fact ("She was born in Port Valham."). Among the candidates is a decoy D of B's kind
  with the same fact: in SUPPORTS claims D states another value, in REFUTES claims D states the
  claimed value and B another. Each node reads `claim [SEP] title [SEP] sentence` alone, so without hop
  attention B and D look alike (which of them did A name?) and the verdict is a coin toss; with it, B
  can read A's sentence. The claimed values appear in neither A's text nor the claim's name.
- **single**: a fact of the page the claim names, stated in one sentence, with the same decoy
  construction (D: another page of the kind, a look-alike where one exists); the title settles it.
- **nei**: something the world never states about the named page (NOT ENOUGH INFO, no evidence).

`_decoy` is the decoy's position among the candidates (None for nei): a model that ranks the gold
fact sentence above it has told B from D, which needs the hop in the multi slice.

The rest of the candidates are other sentences of the pages involved and of look-alikes. Records are
FEVER's JSON-lines claims (`id, verifiable, label, claim, evidence`) plus the `_` fields. Only the
standard library is needed to generate; `evidence_graph_rows` imports `xh.graph.fever`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from xh.synth import layout
from xh.synth.claims import NOT_ENOUGH_INFO, REFUTES, SUPPORTS, UNSTATED_CLAIMS
from xh.synth.names import _display_name, _in_prose, _name
from xh.synth.pages import Page, _article, _fact_surface, _Pages
from xh.synth.questions import BRIDGE_TEMPLATES, _look_alikes
from xh.wiki.titles import fever_page_id

MULTI, SINGLE, NEI = "multi", "single", "nei"
_SALT_EVIDENCE = 0x5E1E_C7ED


class _MultiTemplate(NamedTuple):
    bridge: str  # the name of the `xh.synth.questions` bridge template it follows
    claim: str  # format with {name} (in prose) and {value}; {Name} at the start of a sentence


# The bridge questions' paths (named page -> linked page -> fact) stated as claims.
MULTI_TEMPLATES = (
    _MultiTemplate("founder_birthplace", "The founder of {name} was born in {value}."),
    _MultiTemplate("founder_nationality", "The founder of {name} is {value}."),
    _MultiTemplate("headquarters_founding_year", "The city where {name} is based was founded in {value}."),
    _MultiTemplate("director_nationality", "The director of {name} is {value}."),
    _MultiTemplate("director_birthplace", "The director of {name} was born in {value}."),
    _MultiTemplate("filming_location_country", "{Name} was filmed in a city in {value}."),
    _MultiTemplate("star_birth_year", "The star of {name} was born in {value}."),
    _MultiTemplate("member_birth_year", "The founding member of {name} was born in {value}."),
    _MultiTemplate("band_origin_country", "{Name} comes from a city in {value}."),
    _MultiTemplate("alma_mater_founding_year", "The university attended by {name} was founded in {value}."),
)
_BRIDGES = {t.name: t for t in BRIDGE_TEMPLATES}

# One fact of the named page, as a claim (the single-evidence slice).
SINGLE_TEMPLATES = {
    layout.PERSON: (("birthplace", "{Name} was born in {value}."), ("birth_year", "{Name} was born in {value}.")),
    layout.CITY: (("country", "{Name} is located in {value}."), ("founding_year", "{Name} was founded in {value}.")),
    layout.ORGANISATION: (("founding_year", "{Name} was founded in {value}."),),
    layout.FILM: (("release_year", "{Name} was released in {value}."), ("genre", "{Name} is {article} {value} film.")),
    layout.BAND: (("formation_year", "{Name} was formed in {value}."), ("genre", "{Name} is {article} {value} band.")),
}


class _Draft(NamedTuple):
    label: str
    text: str
    gold: list[tuple[int, int]]  # (page index, line) of the one evidence group, in order
    members: list[tuple[int, int]]  # every candidate sentence, gold first
    key: tuple


def _format(template: str, name: str, value: str = "") -> str:
    return template.format(
        name=_in_prose(name), Name=_in_prose(name, True), value=value, article=_article(value) if value else ""
    )


def _decoy(pages: _Pages, rng: random.Random, like: Page, fact: str, differs_from: str, avoid: set[int]) -> Page | None:
    """A page of `like`'s kind stating `fact` with another value and another base name: a look-alike if any."""
    base = _name(pages.layout, like.index).base
    candidates = _look_alikes(pages.layout, like.index, rng)
    rng.shuffle(candidates)
    candidates += [pages.random_of_kind(rng, like.kind).index for _ in range(30)]
    for c in candidates:
        p = pages[c]
        if c in avoid or p.kind != like.kind or fact not in p.fact_sentences:
            continue
        if _name(pages.layout, c).base == base or _fact_surface(pages, p, fact) == differs_from:
            continue
        return p
    return None


def _fillers(pages: _Pages, rng: random.Random, involved: list[Page], taken: set, k: int) -> list[tuple[int, int]]:
    """k other sentences: of the pages involved, then of their look-alikes and link targets."""
    pool = [(p.index, line) for p in involved for line in range(len(p.sentences))]
    rng.shuffle(pool)
    more = [c for p in involved for c in _look_alikes(pages.layout, p.index, rng)]
    more += [link.target_index for p in involved for link in p.links]
    rng.shuffle(more)
    for c in more[:12]:
        q = pages[c]
        pool.append((c, rng.randrange(len(q.sentences))))
    chosen = []
    for item in pool:
        if len(chosen) == k:
            break
        if item not in taken:
            taken.add(item)
            chosen.append(item)
    return chosen


def _multi(pages: _Pages, rng: random.Random, label: str, nodes: int) -> _Draft | None:
    template = rng.choice(MULTI_TEMPLATES)
    bridge = _BRIDGES[template.bridge]
    a = pages.random_of_kind(rng, bridge.kind)
    if bridge.relation not in a.relations:
        return None
    b = pages[a.relations[bridge.relation]]
    if bridge.fact not in b.fact_sentences:
        return None
    true_value = _fact_surface(pages, b, bridge.fact)
    d = _decoy(pages, rng, b, bridge.fact, true_value, {a.index, b.index})
    if d is None:
        return None
    decoy_value = _fact_surface(pages, d, bridge.fact)
    value = true_value if label == SUPPORTS else decoy_value
    name = _display_name(pages.layout, a.index)
    # the verdict must need B: neither value in A's text nor in the name the claim uses
    if any(v in a.text or v.lower() in name.lower() for v in (true_value, decoy_value)):
        return None
    if true_value not in b.sentences[b.fact_sentences[bridge.fact]]:
        return None
    gold = [(a.index, a.fact_sentences[bridge.relation]), (b.index, b.fact_sentences[bridge.fact])]
    decoy = (d.index, d.fact_sentences[bridge.fact])
    taken = {*gold, decoy}
    members = gold + [decoy] + _fillers(pages, rng, [a, b, d], taken, nodes - 3)
    return _Draft(label, _format(template.claim, name, value), gold, members, (MULTI, template.bridge, a.index))


def _single(pages: _Pages, rng: random.Random, label: str, nodes: int) -> _Draft | None:
    kind = rng.choice(layout.KINDS)
    fact, claim = rng.choice(SINGLE_TEMPLATES[kind])
    p = pages.random_of_kind(rng, kind)
    if fact not in p.fact_sentences:
        return None
    true_value = _fact_surface(pages, p, fact)
    d = _decoy(pages, rng, p, fact, true_value, {p.index})
    if d is None:
        return None
    value = true_value if label == SUPPORTS else _fact_surface(pages, d, fact)
    gold = [(p.index, p.fact_sentences[fact])]
    decoy = (d.index, d.fact_sentences[fact])
    members = gold + [decoy] + _fillers(pages, rng, [p, d], {*gold, decoy}, nodes - 2)
    name = _display_name(pages.layout, p.index)
    return _Draft(label, _format(claim, name, value), gold, members, (SINGLE, fact, p.index))


def _nei(pages: _Pages, rng: random.Random, nodes: int) -> _Draft | None:
    p = pages[rng.randrange(pages.spec.num_docs)]
    text = _format(
        rng.choice(UNSTATED_CLAIMS[p.kind]).replace("{name}", "{Name}"), _display_name(pages.layout, p.index)
    )
    members = _fillers(pages, rng, [p], set(), nodes)
    return _Draft(NOT_ENOUGH_INFO, text, [], members, (NEI, text))


def make_evidence_claims(
    spec: layout.WorldSpec,
    n: int,
    seed: int = 0,
    multi_fraction: float = 0.5,
    nei_fraction: float = 0.2,
    nodes: int = 7,
) -> list[dict]:
    """Up to n claims: `multi_fraction` multi-evidence, `nei_fraction` NOT ENOUGH INFO, the rest single;
    SUPPORTS and REFUTES alternate within each verifiable slice. Small worlds may yield fewer."""
    if n < 0 or nodes < 3 or not (0 <= multi_fraction and 0 <= nei_fraction and multi_fraction + nei_fraction <= 1):
        raise ValueError("n >= 0, nodes >= 3 and fractions in [0, 1] summing to at most 1 required")
    rng = random.Random(layout._mix64(spec.seed, _SALT_EVIDENCE, seed))
    pages = _Pages(spec)
    n_multi, n_nei = round(n * multi_fraction), round(n * nei_fraction)
    wanted = [MULTI] * n_multi + [NEI] * n_nei + [SINGLE] * (n - n_multi - n_nei)
    drafts: list[tuple[str, _Draft]] = []
    seen: set = set()
    made = {MULTI: 0, SINGLE: 0, NEI: 0}
    for slice_ in wanted:
        for _ in range(100):
            label = (SUPPORTS, REFUTES)[made[slice_] % 2]
            if slice_ == MULTI:
                draft = _multi(pages, rng, label, nodes)
            elif slice_ == SINGLE:
                draft = _single(pages, rng, label, nodes)
            else:
                draft = _nei(pages, rng, nodes)
            if draft is not None and draft.key not in seen and draft.text not in seen:
                seen.update((draft.key, draft.text))
                made[slice_] += 1
                drafts.append((slice_, draft))
                break
    rng.shuffle(drafts)
    return [_record(pages, k + 1, slice_, draft, rng) for k, (slice_, draft) in enumerate(drafts)]


def _record(pages: _Pages, claim_id: int, slice_: str, draft: _Draft, rng: random.Random) -> dict:
    members = list(draft.members)
    rng.shuffle(members)  # node order must not tell the gold sentences apart
    candidates = [
        [fever_page_id(pages[i].title), pages[i].title, line, pages[i].sentences[line].strip()] for i, line in members
    ]
    position = {m: k for k, m in enumerate(members)}
    # sentence j of page p links to the page of candidate k: the typed graphs' hyperlink edges
    links = sorted(
        {
            (position[(i, line)], k)
            for i, line in members
            for link in pages[i].links
            if link.sentence_index == line
            for k, (target, _) in enumerate(members)
            if target == link.target_index and target != i
        }
    )
    annotation = 500_000 + claim_id
    if draft.label == NOT_ENOUGH_INFO:
        evidence = [[[annotation, None, None, None]]]
    else:
        evidence = [
            [
                [annotation, 100_000 + 10 * claim_id + j, fever_page_id(pages[i].title), line]
                for j, (i, line) in enumerate(draft.gold)
            ]
        ]
    return {
        "id": claim_id,
        "verifiable": "NOT VERIFIABLE" if draft.label == NOT_ENOUGH_INFO else "VERIFIABLE",
        "label": draft.label,
        "claim": draft.text,
        "evidence": evidence,
        "_slice": slice_,
        "_candidates": candidates,
        "_links": [list(pair) for pair in links],
        # the decoy's sentence (multi, single): the gold sentence it looks like is the group's last
        "_decoy": position[draft.members[len(draft.gold)]] if draft.gold else None,
    }


def evidence_graph_rows(claims: Sequence[dict], edge_mode: str = "full") -> list[dict]:
    """`graphs` rows (task fever) of `make_evidence_claims` records, the candidates in their order.

    edge_mode `full`: every ordered pair an edge (the paper's FEVER graphs); `typed`: the same edges,
    each hyperlink / reverse_hyperlink (a sentence naming the other's page) or co_retrieved, as GESA
    reads them; `hyperlink`: only the edges from a sentence to the sentences of the page it names."""
    from xh.graph.fever import EvidenceSentence, build_fever_graph

    if edge_mode not in ("full", "typed", "hyperlink"):
        raise ValueError(f"edge_mode must be full, typed or hyperlink, got {edge_mode!r}")
    rows = []
    for c in claims:
        groups = [] if c["label"] == NOT_ENOUGH_INFO else c["evidence"]
        gold = {(page, line) for group in groups for _, _, page, line in group}
        claim = {
            "qid": str(c["id"]),
            "claim": c["claim"],
            "label": c["label"],
            "evidence": [[{"page": page, "line": line} for _, _, page, line in group] for group in groups],
        }
        # every candidate "retrieved": the source field must not mark the gold sentences
        sentences = [
            EvidenceSentence(pid, title, line, text, "retrieved", None) for pid, title, line, text in c["_candidates"]
        ]
        row = build_fever_graph(claim, sentences, gold)
        row["_slice"], row["_decoy"] = c["_slice"], c["_decoy"]
        links = {tuple(pair) for pair in c["_links"]}
        if edge_mode == "typed":
            row["edge_mode"] = "typed"
            row["edge_types"] = [
                "hyperlink"
                if (e["src"], e["dst"]) in links
                else "reverse_hyperlink"
                if (e["dst"], e["src"]) in links
                else "co_retrieved"
                for e in row["edges"]
            ]
        elif edge_mode == "hyperlink":
            row["edge_mode"] = "hyperlink"
            row["edges"] = [{"src": i, "dst": j} for i, j in sorted(links)]
        rows.append(row)
    return rows


def drop_anchors(rows: Sequence[dict]) -> list[dict]:
    """Graph rows without node anchors: a node learns nothing of the other paragraphs but through hops.

    (The mention text a HotpotQA node receives tells a no-hop model "some paragraph names me", a
    shortcut past the hop; see tests/integration/test_science.py.)"""
    return [{**r, "nodes": [{**node, "anchors": []} for node in r["nodes"]]} for r in rows]


def question_graph_rows(questions: Sequence[dict], edge_mode: str = "hyperlink", anchors: bool = False) -> list[dict]:
    """`graphs` rows (task hotpot, distractor setting) of `make_questions` records, built by the project's
    graph builder (`xh.graph.hotpot.distractor_graphs`); `anchors=False` removes the node anchors.

    The controlled HotpotQA world of the science checks: `make_questions` (bridge questions whose
    answer is in the linked page only, look-alike distractors; plus comparison questions) read
    without anchors, so what a page learns of the page that names it comes through hop attention."""
    from xh.config import GraphsConfig
    from xh.graph.hotpot import distractor_graphs, distractor_items

    items, bad = distractor_items(list(questions), "synth")
    if bad:
        raise ValueError(f"generated questions rejected by the reader: {bad[:1]}")
    outcomes = distractor_graphs(items, GraphsConfig(setting="distractor", edge_mode=edge_mode))
    rows = [o.graph for o in outcomes if o.graph is not None]
    return rows if anchors else drop_anchors(rows)
