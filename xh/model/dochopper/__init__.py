"""DocHopper (Sun, Cohen, Salakhutdinov): iterative attention over precomputed paragraph and sentence embeddings.

DocHopper never reads the question and the context together while it hops. The context encoder reads
each paragraph alone, so its sentence embeddings can be computed once per corpus; the query encoder
reads the question alone; each hop is a few vector operations:

    s^i_j            = Enc_c(paragraph i)[tokens of sentence j]            mean (or first token)   §3.3
    q_0 .. q_{T-1}   = Enc_q([CLS] question [SEP] [MASK]^(T-1) [SEP])      at [CLS] and each mask    Eq. 2
    for t in 0 .. T-1:
        p_i   = Σ_j α_ij s^i_j,   α_ij = softmax_j(q_t · s^i_j)                                     Eq. 3
        a     = softmax over the table C = {p_0, s^0_0, s^0_1, .., p_1, s^1_0, ..} of q_t · c_m     §3.4
        sentence entry s:   mix = W_q [q_t ; s]                                                     Eq. 4
        paragraph entry i:  k_j = W_q [α_ij q_t ; s^i_j],  mix = Σ_j β_j k_j,  β = softmax_j(v · k_j)  Eq. 5-6
        q̃_t   = Σ_m a_m mix_m        (soft attention: the argmax entry ĉ is "not directly used", §3.4)
        q_t+1 ← q_t+1 + q̃_t                                                                        Eq. 7
    loss_t = cross-entropy(softmax_m(q_t · c_m), positives of hop t)                                §3.4

All inner products are scaled by 1/√H (`scale_scores`, as in attention; the paper's ETC scores are raw:
BERT-family hidden states are far longer, and raw products saturate the softmax at step 0).

HotpotQA (§4.2): four hops (paragraph, sentence, paragraph, sentence); hops 1-2 are supervised by the
first supporting paragraph and its supporting sentences, hops 3-4 by the second (`hop_targets`: the
supporting paragraphs in the order of the data's supporting facts, the one whose supporting sentences
hold the answer last). Evidence e is scored as in Eq. 8 without sparse features:

    score_e(s^i_j) = q_{sentence hop} · s^i_j + λ_e · q_{paragraph hop} · p_i      λ = (0.7, 0.0)

The top 4 sentences of each evidence give 16 combinations (pairs in one paragraph are skipped); a
reader reads each `[CLS] question [SEP] title_a: sentence_a title_b: sentence_b [SEP]` and reranks the
combinations (Xiong et al. 2021's rerank, here: retrieval score + the reader's pair logit on [CLS]).
The reader is a small head of its own on the shared backbone (the project's `HotpotHeads` expect a
graph batch): start/end logits over context tokens, answer type (span / yes / no) and the pair logit on
[CLS]; spans are decoded with `xh.model.decode.best_span` and sliced from the context text. Training
reads the gold combination and `reader_negatives` of the model's own best wrong ones.

    cfg = DocHopperConfig(backbone="path/or/name")
    model = DocHopper.from_backbone(cfg)
    examples = model.prepare(rows)                                 # `graphs` table rows (HotpotQA)
    out = model(model.collate(examples))                           # out.loss, out.losses, out.table_scores
    corpus = dict(zip(doc_ids, model.encode_corpus([(title, sentences), ...])))   # precomputable
    predictions = model.predict(examples, corpus)                  # [{"qid", "answer", "supporting_facts", ..}]
    model.save_pretrained("out/dochopper"); DocHopper.from_pretrained("out/dochopper")

The package: `config` (DocHopperConfig), `examples` (graph rows -> tokenised examples, hop targets),
`batch` (DocHopperBatch, collate), `equations` (Eq. 3-8, the T hops), `corpus` (paragraph sentence
embeddings, CorpusCache), `reader` (combinations, the reader and its losses), `inference` (predict,
predict_rows) and `model` (the DocHopper module, whose methods call into them).

Faithfulness: ETC (global sentence tokens, pretrained with CPC) becomes the project's BERT-family
backbone with pooled sentence spans, one backbone shared by query encoder, context encoder and reader;
the dummy questions q_null become [MASK] tokens after the question.
"""
