"""The evaluation harness (issue 13): one module used by every later method.

    lm = decoder_lm(model_config, params, rest)        # or logits_lm(fn, vocab) for tests
    docs = encode_documents([(domain, text), ...], tokenizer)
    scores = score_documents(lm, docs, prefix_id, context=128)
    bpb_by_domain(docs, scores.nats)                    # bpb.py
    paired_bootstrap(nats_a, nats_b, num_bytes)         # bootstrap.py
    greedy_match(...), choose(...)                      # probes.py (data: probe_data.py)
    routing_report(...), topk_set_changed(...)          # routing.py

model.py holds the one model interface: a callable scoring rows of
(inputs, targets, mask) into target log-probabilities, argmax tokens and
routing; the rest are pure functions of its outputs.
"""
