"""The evaluation harness: one module used by every later method.

    lm = DecoderLM(model_config, params, rest)       # model.py; LogitsLM(fn, vocab) in tests
    docs = encode_documents([(domain, text), ...], tokenizer)           # bpb.py
    scores = score_documents(lm, docs, prefix_id, context=128)
    bpb_by_domain(docs, scores.nats)
    paired_bootstrap(nats_a, nats_b, num_bytes)                         # bootstrap.py
    probe_correct(lm, tokenizer, prefix_id, examples, "greedy", context=128)  # probes.py
    probe_examples("facts", documents, seed, count)                     # probe_data.py
    routing_report(...), topk_set_changed(...)                          # routing.py
    evaluate(...), compare(...)                                         # harness.py: all of it

model.py holds the one model interface: a callable scoring rows of
(inputs, targets, mask) into target log-probabilities, argmax tokens and
routing; the rest are pure functions of its outputs.
"""
