-- Causal attention aligned to the bottom right: with Lq queries and Lk keys
-- (Lq <= Lk, e.g. decoding or chunked prefill against a KV cache), the last
-- query sees every key. Lq and Lk are launch-time symbols: no recompilation
-- when they change.
return {
  name = "causal_bottom_right",
  mask_mod = causal{ align = "bottom_right" },
}
